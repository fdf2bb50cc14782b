"""The runner agent against a real API server (uvicorn in a thread, SQLite, real uv).

A 409 on heartbeat kills the running trial within seconds; stopping gives the
lease back (in-process and through SIGTERM to `bisect-cli runner`); a trial that
ends within the grace period is still reported.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from contract.wire import EnvResult, Lease, RunnerCapabilities, RunnerRegister, TrialReport
from runners.agent import Agent, parse_labels
from runners.client import ApiClient
from runners.spool import Spool
from runners.trial import LocalExecutor
from service.app import create_app
from service.cli import app
from service.cli.serve import bind
from service.settings import Settings
from tests.waiting import wait_until

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n"
# Five steps of 0.5 s, 64 MiB more held (written, so resident) from the third on, then a
# long fifth step: steps 1 to 4 are complete, the first's floor is without the 64 MiB and
# the fourth's with them.
STEPPER = """\
import time

for i in range(5):
    if i == 2:
        held = b"x" * (64 << 20)
    print("::leakbisect-step::", flush=True)
    time.sleep(0.5)
time.sleep(60)
"""
MIB = 2**20
REPRO_PATH = Path(__file__).resolve().parents[1] / "service" / "example" / "repro.py"
REPRO = REPRO_PATH.read_text()
CAPS = RunnerCapabilities(cpus=1, pythons=["3"], platform="test")


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


def sleeper_started(at: AgentThread, client: ApiClient, job_id: int) -> bool:
    """Waits until the agent runs the job's sleeper; a timeout says where the job and the
    agent were."""

    def state() -> str:
        job = client.get_job(job_id)
        return f"job {job['status']} ({job.get('error')}); agent said: {at.lines[-8:]}"

    return wait_until(
        lambda: at.agent.current is not None and at.agent.current.pgid is not None,
        60,
        "the sleeper to start",
        explain=state,
    )


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
        assert sleeper_started(at, client, job_id)
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


def test_the_heartbeat_sends_the_status_lines_steps_and_floors(
    client: ApiClient, fixture_index: str, reachable_tmp: Path, uv_cache: Path
) -> None:
    """What `submit --wait` shows of a running trial comes from its runner's heartbeats: the
    steps its markers span and the floor of its first and latest complete step
    (contract/live.py, fed every sample)."""
    job_id = submit(client, fixture_index, STEPPER)

    def running() -> dict[str, Any] | None:
        shown = client.get_job(job_id)["progress"]["running"]
        return shown[0] if shown and shown[0]["steps"] == 5 else None

    try:
        with AgentThread(client, reachable_tmp, uv_cache):
            shown = wait_until(running, 90, "a heartbeat of all five steps")
        assert shown["floor"] - shown["floor_first"] >= 60 * MIB, shown  # the 64 MiB held
        assert shown["rss"] - shown["floor_first"] >= 60 * MIB, shown  # memory now holds them
        assert shown["early_stop"] == "cap only"  # the job's first run: no horizon yet
    finally:
        client.cancel(job_id)


def test_stop_gives_the_lease_back(
    client: ApiClient, fixture_index: str, reachable_tmp: Path, uv_cache: Path
) -> None:
    job_id = submit(client, fixture_index, SLEEPER)
    try:
        with AgentThread(client, reachable_tmp, uv_cache, grace_s=0.5) as at:
            sleeper_started(at, client, job_id)
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


# ------------------------------------------------------------------ faults: spool, lost answers


def tid(lease_: Lease) -> int:
    return lease_.trial.trial_id


def test_a_spooled_report_is_sent_when_the_runner_starts_again(
    client: ApiClient, fixture_index: str, reachable_tmp: Path, uv_cache: Path, tmp_path: Path
) -> None:
    """A runner died after spooling a finished report: the next one on the same state dir
    sends it (as the runner that held the lease) before it registers; one whose lease is
    gone is refused (409) and dropped. Either way the spool ends empty."""
    job_id = submit(client, fixture_index, REPRO)
    stale_job = submit(client, fixture_index, REPRO, range_="1.0.1..1.0.2")
    with ApiClient(client.base_url, retries=0) as dead:
        me = dead.register(RunnerRegister(name="died-after-spooling", capabilities=CAPS))
        held = [wait_until(lambda: dead.lease(me.runner_id, wait=1), 20, "a lease")]
        held.append(wait_until(lambda: dead.lease(me.runner_id, wait=1), 20, "another lease"))
    by_job = {client.get_trial(tid(h))["job_id"]: h for h in held}
    live, stale = by_job[job_id], by_job[stale_job]
    client.cancel(stale_job)  # its lease goes stale
    state = tmp_path / "state"
    spool = Spool(state)
    for lease_ in (live, stale):
        report = TrialReport(
            trial_id=tid(lease_),
            attempt=lease_.trial.attempt,
            runner_id=me.runner_id,
            env=EnvResult(ok=True),
            pins=[f"leakyfixture=={lease_.trial.env.version}"],
        )
        spool.put(report, me.runner_id, me.runner_secret)
    entries = list((state / "spool").iterdir())
    assert sorted(p.name for p in entries) == sorted(f"trial-{tid(h)}-a1.json" for h in held)
    assert (state / "spool").stat().st_mode & 0o777 == 0o700  # they hold the runner secret
    assert {p.stat().st_mode & 0o777 for p in entries} == {0o600}

    at = AgentThread(client, reachable_tmp, uv_cache, state_dir=state)
    at.agent.stop()  # resend, then stop before registering: no trial runs here
    assert at.agent.run() == 0
    assert at.saw(f"trial {tid(live)}: resending the spooled report")
    assert at.saw(f"trial {tid(live)}: done (exit None, 0.0s): None")
    assert at.saw(f"trial {tid(stale)}: report refused, lease lost (HTTP 409: trial {tid(stale)}")
    assert list((state / "spool").iterdir()) == []
    info = client.get_trial(tid(live))
    assert (info["status"], info["runner_id"], info["attempt"]) == ("done", me.runner_id, 1)
    assert client.get_trial(tid(stale))["status"] == "cancelled"
    client.cancel(job_id)


class DroppingProxy:
    """An HTTP proxy in front of the API that loses the first answer to `POST .../jobs`:
    the server has committed the job, the client sees the connection close with no answer
    (as when a load balancer or the network drops it). One request per connection."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.sock = bind("127.0.0.1", 0)
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.dropped = 0
        self.seen: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self._one(conn)

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += conn.recv(65536)
        lines = [
            line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")
        ]
        return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + rest

    def _one(self, conn: socket.socket) -> None:
        request = self._read_request(conn)
        line = request.split(b"\r\n", 1)[0].decode()
        self.seen.append(line)
        with socket.create_connection(self.upstream) as up:
            up.sendall(request)
            answer = b""
            while chunk := up.recv(65536):
                answer += chunk
        if line.startswith("POST /api/v1/jobs ") and self.dropped == 0:
            self.dropped += 1
            return  # committed upstream; the client gets nothing
        conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()


def test_a_submit_whose_answer_is_lost_creates_one_job(
    server: str, client: ApiClient, fixture_index: str
) -> None:
    proxy = DroppingProxy(server)
    before = client.list_jobs()["total"]
    try:
        result = CliRunner().invoke(
            app,
            ["submit", str(REPRO_PATH), "--package", "leakyfixture", "--range", "1.0.0..1.0.1"]
            + ["--index-url", fixture_index, "--no-reuse", "--server", proxy.url, "--json"],
            env={"BISECT_HTTP_RETRIES": "2"},
        )
    finally:
        proxy.close()
    assert result.exit_code == 0, result.stderr
    assert proxy.dropped == 1
    assert [line.split()[:2] for line in proxy.seen] == [["POST", "/api/v1/jobs"]] * 2
    created = json.loads(result.stdout)
    # --json has both: the API's URL for a client, the status page for a person.
    base, job = proxy.url, created["id"]
    assert (created["url"], created["page_url"]) == (
        f"{base}/api/v1/jobs/{job}",
        f"{base}/jobs/{job}",
    )
    page = client.list_jobs()
    assert page["total"] == before + 1  # the retry found the first job
    assert page["items"][0]["id"] == created["id"]
    client.cancel(created["id"])


def test_logs_strip_terminal_control_sequences(
    server: str, client: ApiClient, fixture_index: str
) -> None:
    """What a script prints reaches `bisect-cli logs` through a runner's report: escape
    sequences (clear screen, window title, colours) and control characters are gone."""
    job_id = submit(client, fixture_index, "pass", range_="1.0.0..1.0.1")
    noisy = "\x1b[2J\x1b]0;owned\x07hello \x1b[31mred\x1b[0m\x07\x08 world\rdone\n"
    with ApiClient(server, retries=0) as runner:
        me = runner.register(RunnerRegister(name="noisy", capabilities=CAPS))
        while True:
            held = wait_until(lambda: runner.lease(me.runner_id, wait=1), 20, "a lease")
            if client.get_trial(tid(held))["job_id"] != job_id:
                continue  # an earlier test's leftover: left to expire
            spec = held.trial
            report = TrialReport(
                trial_id=spec.trial_id,
                attempt=spec.attempt,
                runner_id=me.runner_id,
                env=EnvResult(ok=True),
                pins=[f"leakyfixture=={spec.env.version}"] if spec.kind == "resolve" else None,
                exit_code=0,
                log_tail=noisy,
            )
            runner.complete(spec.trial_id, report)
            if spec.kind == "run":
                break
    number = client.get_trial(spec.trial_id)["number"]
    result = CliRunner().invoke(app, ["logs", str(job_id), str(number), "--server", server])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "hello red world\ndone\n"
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    client.cancel(job_id)
