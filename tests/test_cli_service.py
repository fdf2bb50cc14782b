"""End to end through the command line: `serve`, `runner` processes, `submit --wait`,
`status`, `list`, `logs`, `cancel`; runner death and re-lease on Postgres; one-line errors.

Real processes throughout: `bisect-cli serve --runners 0` on a free port with its
own database, `bisect-cli runner` agents building environments with uv from the
offline fixture index (leakyfixture 1.0.0..1.0.9, first leaking release 1.0.6).
"""

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from runners.client import ApiClient, ApiError
from service.cli import app
from service.example.gitrepo import LEAK_SUBJECT, build_repo, serve_repo
from service.example.index import serve_index
from service.example.suite import build_suite
from service.settings import get_settings
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]
REPRO = REPO / "service" / "example" / "repro.py"
CLI = [sys.executable, "-m", "service.cli"]
SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n"


def read_line(stream: IO[str], timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise AssertionError(f"no line within {timeout}s")
    return stream.readline()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Service:
    """A `serve` process, its runner processes, and the environment they share."""

    home: Path
    env: dict[str, str]
    url: str = ""
    serve: subprocess.Popen | None = None
    runners: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def start_serve(
        self, database_url: str, *args: str, port: int = 0, **extra_env: str
    ) -> None:
        log = self.home / "serve.log"
        with log.open("a") as err:
            self.serve = subprocess.Popen(
                CLI + ["serve", "--port", str(port), "--runners", "0", "--json"]
                + ["--database-url", database_url, *args],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**self.env, **extra_env},
            )  # fmt: skip
        assert self.serve.stdout is not None
        line = read_line(self.serve.stdout, 60)
        assert line, log.read_text()
        self.url = json.loads(line)["url"]

    def start_runner(self, name: str, *args: str, **extra_env: str) -> subprocess.Popen:
        log = self.home / f"{name}.log"
        with log.open("w") as err:
            proc = subprocess.Popen(
                CLI + ["runner", "--server", self.url, "--name", name, "--grace", "2", *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**self.env, **extra_env},
            )
        self.runners.append(proc)
        self.logs.append(log)
        return proc

    def cli(
        self, *args: str, timeout: float = 120, **extra_env: str
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            CLI + list(args),
            capture_output=True,
            text=True,
            env={**self.env, "BISECT_SERVER": self.url, **extra_env},
            timeout=timeout,
        )

    def invoke(self, *args: str, **extra_env: str) -> Result:
        """In process (no interpreter start-up): for the quick commands."""
        return CliRunner().invoke(app, list(args), env={"BISECT_SERVER": self.url, **extra_env})

    def client(self) -> ApiClient:
        return ApiClient(self.url, retries=2, backoff=0.2)

    def stop(self) -> int | None:
        for proc in self.runners:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.runners:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.serve is None:
            return None
        if self.serve.poll() is None:
            self.serve.send_signal(signal.SIGTERM)
        try:
            return self.serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.serve.kill()
            return None


def make_env(home: Path, cache: Path, uv_cache: Path, **extra: str) -> dict[str, str]:
    """`cache` (environments) must be reachable by the trial and build users."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("BISECT_") and k != "UV_CACHE_DIR"
    }
    env.update(
        XDG_DATA_HOME=str(home / "data"),
        XDG_CACHE_HOME=str(cache),
        UV_CACHE_DIR=str(uv_cache),
        BISECT_HEARTBEAT_S="1",
        BISECT_REAP_INTERVAL_S="0.5",
        **extra,
    )
    return env


def leased_trial(client: ApiClient, job_id: int) -> dict[str, Any] | None:
    if client.get_job(job_id)["progress"]["trials_running"] == 0:
        return None
    for trial_id in range(1, 500):
        try:
            trial = client.get_trial(trial_id)
        except ApiError:
            return None
        if trial["job_id"] == job_id and trial["status"] == "leased":
            return trial
    return None


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, reachable_dir, uv_cache: Path
) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("service")
    svc = Service(home, make_env(home, reachable_dir("service-cache"), uv_cache))
    svc.start_serve(f"sqlite:///{home / 'service.db'}")
    svc.start_runner("runner-a")
    svc.start_runner("runner-b")
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def bisection(service: Service, fixture_index: str) -> tuple[subprocess.CompletedProcess, dict]:
    t0 = time.monotonic()
    proc = service.cli(
        "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.0..1.0.9",
        "--index-url", fixture_index, "--wait", "--json",
        timeout=150,
    )  # fmt: skip
    print(f"two runners: submit --wait took {time.monotonic() - t0:.1f}s")
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text() for p in service.logs)
    return proc, json.loads(proc.stdout)


# ------------------------------------------------------------------------------ tests


def test_submit_wait_two_runners_finds_the_first_leak(
    service: Service, bisection: tuple[subprocess.CompletedProcess, dict]
) -> None:
    proc, report = bisection
    assert report["status"] == "found"
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    # The same report as `bisect-cli run --json`: no server extras.
    assert "progress" not in report and "created_at" not in report
    assert {"candidates", "evidence", "dependency_diff", "reproduce", "skipped"} <= report.keys()
    assert report["dependency_diff"] == [
        {"package": "leakyfixture", "last_good": "1.0.5", "first_bad": "1.0.6"}
    ]
    assert proc.stdout.count("\n") == 1  # one JSON object; progress went nowhere
    # --attribute is on by default through the service too: the leak's line, by tracemalloc.
    traced = report["attribution"]["tracers"]["tracemalloc"]["stacks"]
    assert traced[0]["site"] == "leakyfixture/__init__.py:22 in _touched"
    # Both runner processes did work.
    with service.client() as client:
        runners = set()
        for trial_id in range(1, report["trials"] + 1):
            runners.add(client.get_trial(trial_id)["runner_id"])
    assert len(runners) == 2, runners


def test_status_list_logs(service: Service, bisection: tuple) -> None:
    _, report = bisection
    job = report["job_id"]

    status = service.invoke("status", str(job), "--json")
    assert status.exit_code == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["status"] == "found" and shown["first_bad"] == "1.0.6"
    assert shown["progress"]["trials_done"] == report["trials"]

    human = service.invoke("status", str(job))
    assert human.exit_code == 0, human.stderr
    assert f"job {job} found" in human.stdout
    assert "first bad is 1.0.6" in " ".join(human.stdout.split())

    listed = service.invoke("list", "--status", "found", "--package", "LeakyFixture", "--json")
    assert listed.exit_code == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert job in [item["id"] for item in page["items"]]
    assert all(item["status"] == "found" for item in page["items"])
    table = service.invoke("list")
    assert table.exit_code == 0 and "leakyfixture" in table.stdout

    run = report["evidence"][1]["runs"][0]
    trial = run["trial"]  # its number in the job; the API's id is run["trial_id"]
    logs = service.invoke("logs", str(job), str(trial), "--json")
    assert logs.exit_code == 0, logs.stderr
    info = json.loads(logs.stdout)
    assert (info["number"], info["id"]) == (trial, run["trial_id"])
    assert info["version"] == "1.0.6" and info["verdict"] == "leak"
    assert isinstance(info["log_tail"], str)
    plain = service.invoke("logs", str(job), str(trial))
    assert plain.exit_code == 0
    assert plain.stderr.startswith(f"trial {trial} of job {job} (1.0.6): done, leak; attempt 1")
    missing = service.invoke("logs", str(job), "999")
    assert missing.exit_code == 2
    assert missing.stderr == f"error: HTTP 404: job {job} has no trial 999\n"


def test_submit_from_to_finds_the_dependency_then_its_release(
    service: Service, reachable_dir
) -> None:
    """Which dependency through the service: the environment files travel in the job."""
    suite = build_suite(reachable_dir("service-suite") / "suite", "one")
    with serve_index(suite.find_links) as index:
        proc = service.cli(
            "submit", str(suite.repro), "--from", str(suite.good), "--to", str(suite.bad),
            "--index-url", index, "--wait", "--json", "--no-attribute", timeout=400,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text() for p in service.logs)
    report = json.loads(proc.stdout)
    found = report["dependency"]
    assert [c["name"] for c in found["culprits"]] == ["suite-gamma"]
    assert (found["message"], found["certified"]) == (
        "leaks when suite-gamma 1.0.0 -> 1.0.5 is applied", True
    )  # fmt: skip
    # Two runners: ddmin also tries a mix ahead while one is judged (7 mixes with one slot,
    # tests/test_stages_e2e.py), always within the bound; a mix leaks iff new gamma is in it.
    mixes = found["mixes"]
    assert 7 <= len(mixes) <= found["worst_case_mixes"]
    assert [m["label"] for m in mixes[:2]] == ["--from env", "--to env"]
    assert all(
        (m["verdict"] == "leak") == (m["label"] == "--to env" or "suite-gamma 1.0.5" in m["label"])
        for m in mixes
    ), mixes
    assert [(r["package"], r["last_good"], r["first_bad"]) for r in found["releases"]] == [
        ("suite-gamma", "1.0.2", "1.0.3")
    ]


def test_submit_commits_finds_the_leaking_commit(
    service: Service, fixture_index: str, reachable_dir
) -> None:
    """Which commit through the service: a runner lists the commits (the server runs no
    git) from a repository served over http, and runners build each commit it needs."""
    repo = build_repo(reachable_dir("service-git") / "repo")
    with serve_repo(repo.path) as url:
        proc = service.cli(
            "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.6",
            "--index-url", fixture_index, "--commits", "--repo", url, "--no-attribute",
            "--wait", "--json", timeout=400,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text() for p in service.logs)
    found = json.loads(proc.stdout)["commit"]
    assert (found["status"], found["repo"], found["commits"]) == ("found", url, 13)
    assert found["first_bad"] == {"sha": repo.leaking_sha, "subject": LEAK_SUBJECT}
    assert found["last_good"] == {"sha": repo.commits[5][0], "subject": repo.commits[5][1]}
    assert found["message"] == f"first leaking commit: {repo.leaking_sha[:12]} {LEAK_SUBJECT}"


def test_submit_commits_takes_only_an_http_repository(service: Service, tmp_path: Path) -> None:
    """A local clone is `bisect-cli run`'s: runners never read a path a job names."""
    for repo in (str(tmp_path), tmp_path.as_uri()):
        refused = service.invoke(
            "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.6",
            "--commits", "--repo", repo,
        )  # fmt: skip
        assert refused.exit_code == 2
        assert refused.stderr == (
            f"error: HTTP 422: repo: {repo!r}: the API takes an http(s) URL of the "
            "repository (a local clone's path is for `bisect-cli run` only)\n"
        )


def test_submit_prints_url_and_cancel_kills_the_trial(
    service: Service, fixture_index: str, tmp_path: Path
) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    submitted = service.invoke(
        "submit", str(script), "--package", "leakyfixture", "--range", "1.0.0..1.0.2",
        "--index-url", fixture_index, "--no-reuse",
    )  # fmt: skip
    assert submitted.exit_code == 0, submitted.stderr
    page = submitted.stdout.strip()  # the job's status page, for a person (issue 28)
    job = int(page.rsplit("/", 1)[1])
    assert page == f"{service.url}/jobs/{job}"
    with service.client() as client:
        trial = wait_until(lambda: leased_trial(client, job), 60, "a leased trial")
        wait_until(
            lambda: any(f"trial {trial['id']} attempt" in p.read_text() for p in service.logs),
            30,
            "the runner to start it",
        )
        cancelled = service.invoke("cancel", str(job), "--json")
        assert cancelled.exit_code == 0, cancelled.stderr
        assert json.loads(cancelled.stdout)["status"] == "cancelled"
        wait_until(
            lambda: any(
                f"trial {trial['id']}: killed: lease lost" in p.read_text() for p in service.logs
            ),
            10,
            "the runner to kill the trial",
        )
    again = service.invoke("cancel", str(job))
    assert again.exit_code == 2
    assert again.stderr == f"error: HTTP 409: job {job} has already finished (cancelled)\n"
    status = service.invoke("status", str(job), "--json")
    assert json.loads(status.stdout)["status"] == "cancelled"


def test_bad_input_is_one_line(service: Service, fixture_index: str, tmp_path: Path) -> None:
    missing = service.invoke("submit", str(REPRO), "--package", "leakyfixture")
    assert missing.exit_code == 2
    assert missing.stderr == "error: --range: missing; write GOOD..BAD, e.g. 0.11.8..0.11.19\n"

    no_script = service.invoke("submit", "--package", "leakyfixture", "--range", "1..2")
    assert no_script.exit_code == 2
    assert no_script.stderr == "error: SCRIPT: missing; give the repro script to run\n"

    bad_range = service.invoke(
        "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.0..9.9",
        "--index-url", fixture_index,
    )  # fmt: skip
    assert bad_range.exit_code == 2
    assert bad_range.stderr.startswith("error: HTTP 422: range: ")
    assert bad_range.stderr.count("\n") == 1

    nothing = service.invoke("status", "99999")
    assert nothing.exit_code == 2
    assert nothing.stderr == "error: HTTP 404: job 99999 not found\n"

    port = free_port()
    down = service.invoke(
        "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.0..1.0.9",
        "--server", f"http://127.0.0.1:{port}", BISECT_HTTP_RETRIES="1",
    )  # fmt: skip
    assert down.exit_code == 1
    assert down.stderr.startswith(f"error: cannot reach http://127.0.0.1:{port}/api/v1/jobs: ")
    assert down.stderr.count("\n") == 1

    labels = service.invoke("runner", "--labels", "gpu=a100,zone")
    assert labels.exit_code == 2
    assert labels.stderr == "error: --labels: 'zone' is not key=value (write k=v,k2=v2)\n"

    get_settings.cache_clear()
    try:
        open_host = service.invoke(
            "serve", "--host", "0.0.0.0", "--port", str(port),
            BISECT_API_TOKENS="", BISECT_RUNNER_TOKENS="",
        )  # fmt: skip
    finally:
        get_settings.cache_clear()
    assert open_host.exit_code == 2
    assert open_host.stderr.startswith("error: --host 0.0.0.0: no tokens configured")
    assert open_host.stderr.count("\n") == 1

    db = service.invoke(
        "db", "upgrade", "--database-url", f"sqlite:///{tmp_path / 'x.db'}", "--json"
    )
    assert db.exit_code == 0, db.stderr
    assert json.loads(db.stdout)["upgraded"] is True


def test_runner_death_relets_the_trial_on_postgres(
    tmp_path: Path, reachable_tmp: Path, uv_cache: Path, fixture_index: str, pg_url: str
) -> None:
    svc = Service(tmp_path, make_env(tmp_path, reachable_tmp, uv_cache))
    svc.start_serve(pg_url, BISECT_LEASE_S="3")
    submit: subprocess.Popen | None = None
    try:
        first = svc.start_runner("doomed")
        submit = subprocess.Popen(
            CLI + ["submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.7"]
            + ["--index-url", fixture_index, "--wait", "--json", "--server", svc.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=svc.env,
        )  # fmt: skip
        with svc.client() as client:
            job = wait_until(lambda: client.list_jobs()["items"], 60, "the job")[0]["id"]
            trial = wait_until(lambda: leased_trial(client, job), 60, "a leased trial")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            svc.start_runner("successor")
            out, err = submit.communicate(timeout=120)
            assert submit.returncode == 0, err + "".join(p.read_text() for p in svc.logs)
            report = json.loads(out)
            assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
            relet = client.get_trial(trial["id"])
            assert relet["attempt"] == 2 and relet["status"] == "done"
            assert relet["runner_id"] != trial["runner_id"]
    finally:
        if submit is not None and submit.poll() is None:
            submit.kill()
        rc = svc.stop()
    assert rc == 0
    serve_log = (tmp_path / "serve.log").read_text()
    assert "stopped" in serve_log and "Traceback" not in serve_log


def worker_pids(pid: int) -> set[int]:
    """The uvicorn worker processes among `pid`'s children (by `ps`)."""
    out = subprocess.run(
        ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout
    return {int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line}


def test_serve_two_workers_on_postgres(
    tmp_path: Path, reachable_tmp: Path, uv_cache: Path, fixture_index: str, pg_url: str
) -> None:
    svc = Service(tmp_path, make_env(tmp_path, reachable_tmp, uv_cache))
    svc.start_serve(pg_url, "--workers", "2")
    assert svc.serve is not None
    try:
        workers = wait_until(lambda: worker_pids(svc.serve.pid), 10, "the workers")
        assert len(workers) == 2
        svc.start_runner("solo")
        done = svc.cli(
            "submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.7",
            "--index-url", fixture_index, "--wait", "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + "".join(p.read_text() for p in svc.logs)
        report = json.loads(done.stdout)
        assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
        assert worker_pids(svc.serve.pid) == workers  # none died and was replaced
    finally:
        rc = svc.stop()
    assert rc == 0
    serve_log = (tmp_path / "serve.log").read_text()
    assert "2 API worker processes" in serve_log and "stopped" in serve_log
    assert "Traceback" not in serve_log
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    assert not alive, f"workers outlived serve: {alive}"


def test_serve_workers_refused_on_sqlite(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["serve", "--workers", "2", "--database-url", f"sqlite:///{tmp_path / 'x.db'}"]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --workers: SQLite serves from one process; use a postgresql+psycopg:// "
        "--database-url for more workers\n"
    )


# ------------------------------------------------------------------------------ faults


def gated(gate: Path) -> str:
    """The example repro, held at its start until `gate/go` exists (`started-ID` says it
    has begun; a random ID: every trial is pid 2 of its own PID namespace)."""
    return (
        "import os, time, uuid\n"
        f"GATE = {str(gate)!r}\n"
        "open(os.path.join(GATE, f'started-{uuid.uuid4().hex}'), 'w').close()\n"
        "while not os.path.exists(os.path.join(GATE, 'go')):\n"
        "    time.sleep(0.05)\n"
    ) + REPRO.read_text()


def test_an_api_down_longer_than_the_lease_loses_no_report(
    tmp_path: Path, reachable_tmp: Path, uv_cache: Path, fixture_index: str
) -> None:
    """The API is killed (SIGKILL) while a trial runs, stays away for more than twice the
    lease while the trial finishes, and comes back on the same database: the runner's
    spooled report is stored under its first lease and the job finds the right release."""
    gate = reachable_tmp / "gate"
    gate.mkdir()
    gate.chmod(0o777)  # the trial user writes its `started` mark here
    script = tmp_path / "gated.py"
    script.write_text(gated(gate))
    svc = Service(tmp_path, make_env(tmp_path, reachable_tmp / "cache", uv_cache))
    # A lease of 5 s with a heartbeat every second: room for a loaded machine's delays.
    db, port, lease_s = f"sqlite:///{tmp_path / 'faults.db'}", free_port(), 5
    svc.start_serve(db, port=port, BISECT_LEASE_S=str(lease_s))
    try:
        runner = svc.start_runner(
            "patient", "--state-dir", str(tmp_path / "state"), BISECT_HTTP_RETRIES="1"
        )
        submitted = svc.cli(
            "submit", str(script), "--package", "leakyfixture", "--range", "1.0.5..1.0.7",
            "--index-url", fixture_index, "--no-reuse",
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        job = int(submitted.stdout.strip().rsplit("/", 1)[1])
        wait_until(lambda: list(gate.glob("started-*")), 90, "the first run to start")
        assert svc.serve is not None
        svc.serve.kill()
        svc.serve.wait(10)
        down_at = time.monotonic()
        (gate / "go").touch()  # the trial finishes while the API is away
        log = tmp_path / "patient.log"
        wait_until(lambda: "report not delivered" in log.read_text(), 60, "a failed delivery")
        # Away for more than twice the lease: without the renewal at start it would be reaped.
        time.sleep(max(0.0, down_at + 2.5 * lease_s - time.monotonic()))
        svc.start_serve(db, port=port, BISECT_LEASE_S=str(lease_s))
        with svc.client() as client:
            shown = wait_until(
                lambda: (j := client.get_job(job))["status"] in ("found", "error", "inconclusive")
                and j,
                120,
                "the job to finish",
            )
            assert (shown["status"], shown["last_good"], shown["first_bad"]) == (
                "found",
                "1.0.5",
                "1.0.6",
            ), shown["message"]
            text = log.read_text()
            late = {int(line.split("trial ")[1].split(":")[0]) for line in text.splitlines()
                    if "report not delivered (" in line}  # fmt: skip
            assert len(late) == 1, text
            trial_id = late.pop()
            stored = client.get_trial(trial_id)
            assert (stored["status"], stored["attempt"]) == ("done", 1), stored
            assert stored["verdict"] in ("clean", "leak")
            assert f"trial {trial_id}: done (exit 0" in text
        assert list((tmp_path / "state" / "spool").iterdir()) == []
        assert runner.poll() is None  # the runner rode it out
    finally:
        svc.stop()


def test_the_runner_token_never_is_on_its_command_line(
    tmp_path: Path, reachable_tmp: Path, uv_cache: Path
) -> None:
    token = "runner-token-4c1d"
    tokens = {"BISECT_RUNNER_TOKENS": f"fleet:{token}", "BISECT_API_TOKENS": "ci:client-tok"}
    svc = Service(tmp_path, make_env(tmp_path, reachable_tmp, uv_cache))
    svc.start_serve(f"sqlite:///{tmp_path / 'tok.db'}", **tokens)
    token_file = tmp_path / "runner.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    try:
        by_file = svc.start_runner("by-file", "--token-file", str(token_file))
        by_env = svc.start_runner("by-env", BISECT_RUNNER_TOKEN=token)
        for proc, name in ((by_file, "by-file"), (by_env, "by-env")):
            log = tmp_path / f"{name}.log"
            wait_until(lambda log=log: "registered as" in log.read_text(), 30, "registration")
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            assert b"runner\x00--server" in argv and token.encode() not in argv
        environ = Path(f"/proc/{by_file.pid}/environ").read_bytes()
        assert token.encode() not in environ  # the file route leaves no copy in the env
        wrong = tmp_path / "wrong.token"
        wrong.write_text("not-the-token\n")
        wrong.chmod(0o600)  # a token file others can read is refused before the server is asked
        refused_by_server = svc.cli("runner", "--token-file", str(wrong), timeout=60)
        assert refused_by_server.returncode == 2
        assert refused_by_server.stderr.endswith("error: HTTP 401: invalid bearer token\n")
    finally:
        svc.stop()
    refused = svc.invoke("runner", "--token", token)
    assert refused.exit_code == 2
    assert refused.stderr == (
        "error: --token: a token on the command line is readable by every user "
        "(/proc/PID/cmdline); use --token-file FILE or env BISECT_RUNNER_TOKEN\n"
    )
    missing = svc.invoke("runner", "--token-file", str(tmp_path / "nope"))
    assert missing.exit_code == 2
    assert missing.stderr == (
        f"error: --token-file: cannot read {tmp_path / 'nope'}: No such file or directory\n"
    )
