"""End to end: a poisoned earlier job never decides a later one (service/reuse.py), through
`bisect-cli run` on the offline fixture: real uv, real child processes, one SQLite file.

The repro is the bundled one plus a leak of its own, 1 MiB a step, when the job's `--env`
sets LEAK=1 or while a flag file exists: the file stands for what the key cannot see (a
loaded machine calling an import ramp a leak), the variable for what it must see. The
jobs, in order, on 1.0.5..1.0.6 (1.0.6 is the fixture's first leaking release):

1. `--env LEAK=1`: the good bound leaks, bounds_failed after one run.
2. the flag file present: the same, under the plain key: a strong-looking wrong verdict.
3. plain: reuses job 2's "1.0.5: leak" (not job 1's: another key), runs 1.0.5 before
   failing on it, and the run disagrees: inconclusive, and 1.0.5 is flaky in both views.
4. plain: job 2's verdict is contradicted and job 3's a copy, so nothing is reused; it
   runs both releases itself and finds the boundary.
"""

import io
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from service.app import create_app
from service.cli.display import render_report
from service.cli.localdb import LocalSource
from service.schemas import Report
from service.settings import Settings
from tests.test_run_e2e import cli, run_args

REPRO = """\
import os
import time

import leakyfixture

held = []
for _ in range(40):
    leakyfixture.step()
    if os.environ.get("LEAK") == "1" or os.path.exists({flag!r}):
        held.append(bytearray(b"\\xa5") * (1 << 20))
    print("::leakbisect-step::", flush=True)
    time.sleep(0.05)
"""
RANGE = "1.0.5..1.0.6"


def visited(db: Path, job: int) -> list[tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(
            "select c.version, t.verdict from trial t join candidate c on c.id = t.candidate_id "
            "where t.job_id = ? and t.kind = 'run' order by t.id",
            (job,),
        ).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def jobs(reachable_dir, fixture_index: str, uv_cache: Path) -> dict[str, Any]:
    home = reachable_dir("reuse-e2e")
    flag = home / "loaded"
    script = home / "repro.py"
    script.write_text(REPRO.format(flag=str(flag)))
    db = home / "results.db"

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        args = run_args(RANGE, fixture_index, db, "--no-attribute", *extra, script=script)
        return cli(args, home, uv_cache)

    out: dict[str, Any] = {"db": db, "env": run("--env", "LEAK=1")}
    flag.write_text("")
    flag.chmod(0o644)
    try:
        out["loaded"] = run()
    finally:
        flag.unlink()
    out["idle"] = run()
    out["later"] = run()
    return out


def report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(proc.stdout)


def test_an_env_leak_is_kept_to_its_own_key(jobs: dict[str, Any]) -> None:
    for name in ("env", "loaded"):
        proc = jobs[name]
        assert proc.returncode == 3, proc.stderr
        answer = report(proc)
        assert (answer["status"], answer["message"]) == (
            "bounds_failed",
            "good bound 1.0.5 leaks: it must not; to map a range whose bounds agree, use "
            "--all-transitions",
        )
        assert answer["trials"] == 1
    assert visited(jobs["db"], 1) == [("1.0.5", "leak")]
    assert visited(jobs["db"], 2) == [("1.0.5", "leak")]


def test_a_copied_verdict_at_a_bound_is_run_and_its_contradiction_shown(
    jobs: dict[str, Any],
) -> None:
    proc = jobs["idle"]
    assert proc.returncode == 4, proc.stderr
    answer = report(proc)
    assert (answer["job_id"], answer["status"]) == (3, "inconclusive")
    assert answer["message"].splitlines() == [
        "good bound 1.0.5 is flaky: its evaluations disagree (leak, clean)",
        "verdict of 1.0.5 reused from job 2",  # job 2's, never job 1's (LEAK=1)
    ]
    assert visited(jobs["db"], 3) == [("1.0.5", "clean")]
    rows = {c["version"]: c for c in answer["candidates"]}
    assert (rows["1.0.5"]["reused"], rows["1.0.5"]["contradicted_by_job"]) == (True, 2)
    assert (rows["1.0.6"]["verdict"], rows["1.0.6"]["contradicted_by_job"]) == (None, None)
    con = sqlite3.connect(jobs["db"])
    marked = con.execute(
        "select job_id, version, evaluations, contradicted_by_job from candidate "
        "where contradicted_by_job is not null order by job_id"
    ).fetchall()
    con.close()
    assert marked == [(2, "1.0.5", '["leak"]', 3), (3, "1.0.5", '["leak", "clean"]', 2)]


def views(db: Path, job: int) -> tuple[dict[str, Any], str, str]:
    """What `bisect-cli report JOB --local` prints with --json, alone and with --markdown,
    from the same source and renderers, in this process."""
    with LocalSource.open(f"sqlite:///{db}") as source:
        data, markdown = source.get_job(job).model_dump(mode="json"), source.markdown(job)
    out = io.StringIO()
    render_report(Console(file=out, width=200, no_color=True), Report.model_validate(data), {})
    return data, out.getvalue(), markdown


def candidate_rows(markdown: str) -> list[str]:
    lines = markdown.splitlines()
    start = lines.index("| release | verdict | runs | floor growth (MiB) | note |") + 2
    return lines[start : lines.index("", start)]


@pytest.mark.parametrize(("job", "other"), [(2, 3), (3, 2)])
def test_both_jobs_views_say_flaky(jobs: dict[str, Any], job: int, other: int) -> None:
    data, text, markdown = views(jobs["db"], job)
    mark = f"flaky: contradicted by job {other}"
    verdict = "leak" if job == 2 else "clean"  # job 3's own run was the clean one
    rows = [(c["version"], c["verdict"], c["contradicted_by_job"]) for c in data["candidates"]]
    assert rows == [("1.0.5", verdict, other), ("1.0.6", None, None)]
    lines = [line for line in text.splitlines() if mark in line]
    cells = [cell.strip() for cell in lines[0].split("│")] if len(lines) == 1 else []
    assert cells[1:3] == ["1.0.5", verdict], lines
    notes = mark if job == 2 else f"verdict reused from an earlier job; {mark}"
    (row,) = candidate_rows(markdown)  # 1.0.6 never ran
    assert row.startswith(f"| 1.0.5 | {verdict} | 1 |") and row.endswith(f"| {notes} |"), row


def test_the_web_page_says_flaky(jobs: dict[str, Any], tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{jobs['db']}",
        data_dir=tmp_path,
        cache_dir=tmp_path / "cache",
        reap_interval_s=0,
        trusted_hosts=["testserver"],
    )
    with TestClient(create_app(settings)) as client:
        for job, other in ((2, 3), (3, 2)):
            page = client.get(f"/jobs/{job}", params={"candidate": "1.0.5"})
            assert page.status_code == 200, page.text
            mark = f"flaky: contradicted by job {other}"
            assert f'<span class="mark" title="{mark}">F</span>' in page.text
            assert f"Flaky: contradicted by job {other}." in page.text


def test_a_contradicted_verdict_is_never_copied_again(jobs: dict[str, Any]) -> None:
    proc = jobs["later"]
    assert proc.returncode == 0, proc.stderr
    answer = report(proc)
    assert (answer["status"], answer["last_good"], answer["first_bad"]) == (
        "found",
        "1.0.5",
        "1.0.6",
    )
    assert not any(c["reused"] for c in answer["candidates"])
    assert "reused" not in answer["message"]
    assert visited(jobs["db"], 4) == [
        ("1.0.5", "clean"), ("1.0.6", "leak"), ("1.0.5", "clean"), ("1.0.6", "leak")
    ]  # fmt: skip
