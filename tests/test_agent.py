"""The runner agent against a real API server (uvicorn in a thread, SQLite, real uv).

A 409 on heartbeat kills the running trial within seconds; stopping gives the
lease back (in-process and through SIGTERM to `bisect-cli runner`); a trial that
ends within the grace period is still reported.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from runners.agent import Agent, parse_labels
from runners.client import ApiClient
from runners.trial import LocalExecutor
from runners.wire import RunnerCapabilities
from service.api.app import create_app
from service.cli.serve import bind
from service.settings import Settings

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n"
REPRO = (Path(__file__).resolve().parents[1] / "service" / "example" / "repro.py").read_text()
CAPS = RunnerCapabilities(cpus=1, pythons=["3"], platform="test")


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, uv_cache: Path) -> Iterator[str]:
    home = tmp_path_factory.mktemp("agent-api")
    saved = os.environ.get("UV_CACHE_DIR")
    os.environ["UV_CACHE_DIR"] = str(uv_cache)  # the server resolves the good bound's pins
    settings = Settings(
        database_url=f"sqlite:///{home / 'api.db'}",
        data_dir=home / "data",
        cache_dir=home / "cache",
        lease_s=30,
        heartbeat_s=0.3,
        reap_interval_s=0.5,
    )
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, 20, "the API to start")
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)
    if saved is None:
        os.environ.pop("UV_CACHE_DIR", None)
    else:
        os.environ["UV_CACHE_DIR"] = saved


@pytest.fixture
def client(server: str) -> Iterator[ApiClient]:
    with ApiClient(server, retries=2, backoff=0.1) as c:
        yield c


def submit(client: ApiClient, index: str, script: str, range_: str = "1.0.0..1.0.1") -> int:
    job = client.submit(
        {
            "package": "leakyfixture",
            "range": range_,
            "script": script,
            "index_url": index,
            "timeout_s": 120,
            "reuse_verdicts": False,
        }
    )
    return job["id"]


def leased_trial(client: ApiClient, job_id: int) -> dict[str, Any] | None:
    """The job's leased trial, found through its first trial ids (a fresh job per test)."""
    report = client.get_job(job_id)
    if report["progress"]["trials_running"] == 0:
        return None
    for trial_id in range(1, 200):
        try:
            trial = client.get_trial(trial_id)
        except Exception:  # noqa: BLE001 - past the last trial
            return None
        if trial["job_id"] == job_id and trial["status"] == "leased":
            return trial
    return None


class AgentThread:
    def __init__(self, client: ApiClient, tmp: Path, uv_cache: Path, **kw: Any):
        self.lines: list[str] = []
        self.agent = Agent(
            client,
            "test-agent",
            {"suite": "agent"},
            LocalExecutor(tmp / "envs", uv_cache),
            None,
            lease_wait=1,
            log=self.lines.append,
            capabilities=CAPS,
            **kw,
        )
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(self.agent.run()))

    def __enter__(self) -> "AgentThread":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.agent.stop()
        self.agent.stop()  # no grace period
        self.thread.join(30)

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader still counts for killpg; check the process state.
    try:
        with open(f"/proc/{pgid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_parse_labels() -> None:
    assert parse_labels("gpu=a100, zone = eu ,") == {"gpu": "a100", "zone": "eu"}
    assert parse_labels(None) == {}
    with pytest.raises(ValueError, match=r"^'zone' is not key=value"):
        parse_labels("gpu=a100,zone")
    with pytest.raises(ValueError, match="given twice"):
        parse_labels("a=1,a=2")


def test_stale_heartbeat_kills_the_trial(
    client: ApiClient, fixture_index: str, reachable_tmp: Path, uv_cache: Path
) -> None:
    job_id = submit(client, fixture_index, SLEEPER)
    with AgentThread(client, reachable_tmp, uv_cache) as at:
        running = wait_until(
            lambda: at.agent.current is not None and at.agent.current.pgid is not None,
            60,
            "the sleeper to start",
        )
        assert running
        trial = at.agent.current
        assert trial is not None and trial.pgid is not None
        pgid = trial.pgid
        assert group_alive(pgid)
        t0 = time.monotonic()
        cancelled = client.cancel(job_id)  # the lease goes stale: the next heartbeat is 409
        assert cancelled["status"] == "cancelled"
        wait_until(lambda: at.saw("report dropped"), 10, "the agent to drop the trial")
        killed_after = time.monotonic() - t0
        assert killed_after < 5, killed_after
        assert not group_alive(pgid)
        assert at.saw(f"trial {trial.spec.trial_id}: killed: lease lost (HTTP 409: ")
        # The agent goes on polling for work.
        assert at.thread.is_alive()
    assert at.result == [0]
    assert at.saw("left (")


def test_stop_gives_the_lease_back(
    client: ApiClient, fixture_index: str, reachable_tmp: Path, uv_cache: Path
) -> None:
    job_id = submit(client, fixture_index, SLEEPER)
    try:
        with AgentThread(client, reachable_tmp, uv_cache, grace_s=0.5) as at:
            wait_until(
                lambda: at.agent.current is not None and at.agent.current.pgid is not None,
                60,
                "the sleeper to start",
            )
            trial = at.agent.current
            assert trial is not None and trial.pgid is not None
            at.agent.stop()
            at.thread.join(15)
            assert not at.thread.is_alive()
            assert not group_alive(trial.pgid)
        assert at.result == [0]
        assert at.saw(f"trial {trial.spec.trial_id}: lease given back (shutting down)")
        info = client.get_trial(trial.spec.trial_id)
        assert info["status"] == "queued" and info["attempt"] == 0  # no attempt used up
    finally:
        client.cancel(job_id)


def test_trial_finishing_within_grace_is_reported(
    client: ApiClient, fixture_index: str, reachable_tmp: Path, uv_cache: Path
) -> None:
    job_id = submit(client, fixture_index, REPRO, range_="1.0.5..1.0.6")
    try:
        with AgentThread(client, reachable_tmp, uv_cache, grace_s=30) as at:
            wait_until(
                lambda: at.agent.current is not None and at.agent.current.spec.kind == "run",
                60,
                "a lease of a run (the resolve trial of the job's pins comes first)",
            )
            trial = at.agent.current
            assert trial is not None
            at.agent.stop()  # one signal: finish within the grace period
            at.thread.join(40)
            assert not at.thread.is_alive()
        info = client.get_trial(trial.spec.trial_id)
        assert info["status"] == "done" and info["verdict"] in ("clean", "leak")
        assert info["runner_id"] is not None and info["attempt"] == 1
        assert at.saw(f"trial {trial.spec.trial_id}: done (exit 0")
    finally:
        client.cancel(job_id)


def test_idle_stop_is_prompt(client: ApiClient, reachable_tmp: Path, uv_cache: Path) -> None:
    with AgentThread(client, reachable_tmp, uv_cache) as at:
        wait_until(lambda: at.saw("registered as"), 10, "registration")
        time.sleep(0.3)  # inside a long poll now
        t0 = time.monotonic()
        at.agent.stop()
        at.thread.join(10)
        assert time.monotonic() - t0 < 3
    assert at.result == [0] and at.saw("left (")


def test_sigterm_to_the_runner_command_returns_the_lease(
    server: str,
    client: ApiClient,
    fixture_index: str,
    tmp_path: Path,
    reachable_tmp: Path,
    uv_cache: Path,
) -> None:
    job_id = submit(client, fixture_index, SLEEPER)
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CACHE_HOME": str(reachable_tmp / "cache"),
        "UV_CACHE_DIR": str(uv_cache),
    }
    log = tmp_path / "runner.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "runner", "--server", server]
            + ["--name", "sigterm-test", "--labels", "suite=agent", "--grace", "1"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    try:
        trial = wait_until(lambda: leased_trial(client, job_id), 60, "a leased trial")
        wait_until(lambda: ": leased leakyfixture" in log.read_text(), 30, "the lease in the log")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        info = client.get_trial(trial["id"])
        assert info["status"] == "queued" and info["attempt"] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        client.cancel(job_id)
    text = log.read_text()
    assert "SIGTERM: stopping" in text
    assert f"trial {trial['id']}: lease given back (shutting down)" in text
    assert "left (" in text
    assert "Traceback" not in text
