"""The infrastructure is never the script (issue 35, item 4), end to end on loopback only.

Served: `bisect-cli serve --runners 2` with an index allowlist that lists the fixture
index's port and not the port its files live on (`serve_index(files_at=...)`, a second
127.0.0.1 port). The egress proxy refuses the file host before connecting; the first trial
(resolving the good bound's pins) is tried `INFRA_TRIES` times, alternating between the two
runners, and the job ends
as an error naming the host:port and the rule, in `submit --wait --json`, the REST job,
`report --markdown` and the page; never "untestable", never a skip.

Local: `bisect-cli run --as-released` (no outbound rule: the user's own job; no pins, so the
good bound's run trial is the first) against an index whose files are on a port that
answers 404: an index error, the same answer in the text report, `--json` and
`report --markdown`.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli.errors import OUTCOME_STATUS
from service.example.index import serve_index
from service.queue import INFRA_TRIES
from tests.test_cli_service import REPRO, Service, make_env

CLI = [sys.executable, "-m", "service.cli"]
RULE = "host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES"
STOPPED = "stopped by an infrastructure failure, not a verdict of any release"


@pytest.fixture(scope="module")
def split_index(fixture_wheels: Path) -> Iterator[tuple[str, int]]:
    """The fixture index whose pages link the files on another loopback port: (the index
    URL, the files' port)."""
    with serve_index(fixture_wheels) as files:
        port = int(files.split(":")[2].split("/")[0])
        with serve_index(fixture_wheels, files_at=f"http://127.0.0.1:{port}/files/") as index:
            yield index, port


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, reachable_dir, uv_cache: Path, split_index
) -> Iterator[tuple[Service, dict[str, Any], subprocess.CompletedProcess]]:
    index, _ = split_index
    listed = index.split("/")[2]  # 127.0.0.1:PORT of the index, not of its files
    home = tmp_path_factory.mktemp("infra-served")
    env = make_env(home, reachable_dir("infra-cache"), uv_cache, BISECT_ALLOWED_INDEXES=listed)
    svc = Service(home, env)
    svc.start_serve(f"sqlite:///{home / 'service.db'}", "--runners", "2")
    try:
        proc = svc.cli(
            "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.0..1.0.9",
            "--index-url", index, "--wait", "--json", timeout=180,
        )  # fmt: skip
        report = json.loads(proc.stdout) if proc.stdout.strip() else {}
        yield svc, report, proc
    finally:
        svc.stop()


def refused_answer(files_port: int) -> tuple[str, str]:
    """The job's exact message and the refusal's line. The trial that fails is the first
    one, alone: the good bound's resolution of the pins every candidate is held at."""
    host = f"127.0.0.1:{files_port}"
    refusal = f"the job's outbound rule refused {host}: {RULE}"
    message = f"{STOPPED}: leakyfixture 1.0.0 failed 3 times on 2 runners: {refusal}"
    return message, refusal


def test_a_refused_file_host_is_the_infrastructure_s_answer_in_json(
    served: tuple[Service, dict[str, Any], subprocess.CompletedProcess], split_index
) -> None:
    svc, report, proc = served
    _, port = split_index
    assert proc.returncode == OUTCOME_STATUS["error"], proc.stderr
    message, refusal = refused_answer(port)
    assert (report["status"], report["message"]) == ("error", message)
    assert report["infrastructure"] == {
        "version": "1.0.0",
        "trial": 1,
        "tries": INFRA_TRIES,
        "runners": 2,
        "cause": "refused",
        "host": f"127.0.0.1:{port}",
        "rule": RULE,
        "message": refusal,
    }
    # No release got a verdict from it: nothing was skipped, nothing untestable but 1.0.4
    # (the fixture's foreign-platform release, listed as such before anything ran).
    assert {c["version"]: c["verdict"] for c in report["candidates"] if c["verdict"]} == {}
    assert report["skipped"] == ["1.0.4"]
    assert report["trials"] == 0
    logs = (svc.home / "serve.log").read_text()
    assert logs.count(f"egress refused http://127.0.0.1:{port}/files/") >= INFRA_TRIES


def test_the_rest_job_the_markdown_and_the_page_say_the_same(
    served: tuple[Service, dict[str, Any], subprocess.CompletedProcess], split_index
) -> None:
    svc, report, _ = served
    message, _ = refused_answer(split_index[1])
    job_id = report["job_id"]
    job = httpx.get(f"{svc.url}/api/v1/jobs/{job_id}").json()
    assert (job["status"], job["message"], job["infrastructure"]) == (
        "error",
        message,
        report["infrastructure"],
    )
    markdown = svc.cli("report", str(job_id), "--markdown")
    assert markdown.returncode == 0, markdown.stderr
    assert f"**error: {message}**" in markdown.stdout.replace("\\", "")
    note = "no verdict: the infrastructure failed it 3 times on 2 runners"
    assert f"| 1.0.0 |  | 0 |  | {note} |" in markdown.stdout.replace("\\", "")
    page = httpx.get(f"{svc.url}/jobs/{job_id}").text
    assert message.replace("'", "&#39;") in page
    assert f'<span class="mark" title="{note}">I</span>' in page
    for words in ("untestable", "cannot be tested", "skipped it"):
        assert words not in message


# ------------------------------------------------------------------ bisect-cli run


@pytest.fixture(scope="module")
def missing_files(fixture_wheels: Path, tmp_path_factory: pytest.TempPathFactory):
    """The fixture index whose files are on a port that answers 404 for every file."""
    empty = tmp_path_factory.mktemp("no-files")
    with serve_index(empty) as files:
        base = files.replace("/simple", "/files/")
        with serve_index(fixture_wheels, files_at=base) as index:
            yield index, base


def run(args: list[str], home: Path, uv_cache: Path) -> subprocess.CompletedProcess[str]:
    # COLUMNS: the text report's lines unwrapped, to be compared whole.
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"), "COLUMNS": "1000",
           "XDG_CACHE_HOME": str(home / "cache"), "UV_CACHE_DIR": str(uv_cache)}  # fmt: skip
    env = {k: v for k, v in env.items() if not k.startswith("BISECT_")}
    return subprocess.run(CLI + args, capture_output=True, text=True, env=env, timeout=300)


def test_bisect_cli_run_ends_on_an_index_error_naming_it(
    reachable_dir, uv_cache: Path, missing_files: tuple[str, str]
) -> None:
    index, base = missing_files
    home = reachable_dir("infra-run")
    db = f"sqlite:///{home / 'results.db'}"
    # --as-released: no pins to resolve first, so what fails is the good bound's run trial.
    args = ["run", str(REPRO), "--package", "leakyfixture", "--range", "1.0.0..1.0.9",
            "--index-url", index, "--database-url", db, "--as-released"]  # fmt: skip
    url = f"{base}leakyfixture-1.0.0-py3-none-any.whl"
    cause = (
        f"an index or a file it lists answered HTTP 404: Failed to fetch: {url}: "
        f"HTTP status client error (404 Not Found) for url ({url})"
    )
    message = f"{STOPPED}: leakyfixture 1.0.0 failed 3 times: {cause}"

    as_json = run([*args, "--json"], home, uv_cache)
    assert as_json.returncode == OUTCOME_STATUS["error"], as_json.stderr
    report = json.loads(as_json.stdout)
    assert (report["status"], report["message"]) == ("error", message)
    assert report["infrastructure"] == {
        "version": "1.0.0", "trial": 1, "tries": 3, "runners": 1, "cause": "index-error",
        "host": None, "rule": None, "message": cause,
    }  # fmt: skip
    assert report["trials"] == 0 and report["skipped"] == ["1.0.4"]

    as_text = run(args, home, uv_cache)
    assert as_text.returncode == OUTCOME_STATUS["error"], as_text.stderr
    lines = as_text.stdout.splitlines()
    assert lines[lines.index("leakyfixture: error") + 1] == message
    shown = as_text.stdout + as_text.stderr
    for n, again in ((1, "trying again"), (2, "trying again"), (3, "giving up")):
        assert f"1.0.0: infrastructure failure ({n} of 3), {again}: {cause}" in shown

    note = "no verdict: the infrastructure failed it 3 times"
    [row] = [line for line in lines if line.startswith("│ 1.0.0 ")]
    assert [cell.strip() for cell in row.split("│")[1:6]] == ["1.0.0", "not tested", "0", "", note]

    markdown = run(["report", "2", "--markdown", "--local", "--database-url", db], home, uv_cache)
    assert markdown.returncode == 0, markdown.stderr
    assert f"**error: {message}**" in markdown.stdout.replace("\\", "")
    assert f"| 1.0.0 |  | 0 |  | {note} |" in markdown.stdout.replace("\\", "")
    assert "cannot be tested" not in markdown.stdout and "untestable" not in message
