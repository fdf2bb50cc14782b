"""The runner agent: register, long-poll for leases, run trials, heartbeat, report.

One trial at a time. The trial runs in a worker thread (the `Executor`) while
the agent's thread heartbeats every ``heartbeat_s`` (the lease's figure),
sending what the trial's status line shows (contract/live.py: its latest RSS, the
steps its markers span, its first and latest floor; nothing before its first
sample). A heartbeat answered 409 means the lease is no
longer ours (re-leased after its deadline, or the job was cancelled): the
agent kills the trial and drops its report.

Killing a trial: the executor (`runners.trial.Executor`) hands over a ``kill``
callable once the script runs; `_Trial.kill` calls it, and the executor then
returns as for any killed script, after sweeping stragglers and the cgroup. A
kill requested while the environment is still being built takes effect the
moment the script starts (uv builds are not interrupted).

A trial whose machine failed under it (`contract.errors.InfrastructureFailure`: a Slurm
node failed, the job was preempted) has no outcome: its lease is given back, so it is
queued again without using an attempt, and the log says why. A trial the infrastructure
failed in a way the runner can name (`contract.wire.Cause`: a host the egress rule refused,
an index's error, uv's timeout, a full disk, in the build's `EnvResult.failure` or the
report's own `failure`) is reported like any other: the service retries it, on another
runner where one is live, and ends the job naming the cause when it persists
(service/queue.py, infrastructure rules).

Stopping (`stop()`, SIGTERM or SIGINT through `install_signal_handlers`): no
new leases; a running trial may finish within ``grace_s`` (and is reported as
usual), else it is killed and its lease given back (queued again without
using up an attempt); then the agent leaves (DELETE /runners/{id}, which also
returns any lease it did not know about) and `run` returns 0. A second signal
skips the grace period.

Network trouble never stops the agent: the client retries with backoff, and
the loop keeps trying after that (a lease that is not heartbeated in time is
simply re-leased by the server's reaper).

Reports are never lost to an outage: a finished report is spooled to the state
directory (runners/spool.py) before it is posted, then posted again and again
(backoff doubling to ``report_retry_max_s``, at most a third of the lease) until
the server stores it or refuses it for good (409 lease lost, 403, 404, any other
4xx); only then is it removed. Stopping while the server is still away leaves
it spooled, and the next agent started on the same state directory sends it
before it registers. The server renews every lease when it starts
(service/queue.py), so a report delivered soon after the server is back is
stored, however long it was away.

The state directory holds runner secrets (each spooled report carries the secret it must
be sent with): the levels of it the agent creates are mode 0700, the spool directory in it
0700 and each entry 0600 (runners/spool.py), so no trial user can read them.

Every event is one log line through ``log`` (default: stderr, with a time).
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from contract.errors import InfrastructureFailure
from contract.executor import Executor, Kill
from contract.live import LiveFloors
from contract.wire import (
    EnvResult,
    Failure,
    Heartbeat,
    Lease,
    LeaseReturn,
    RunnerCapabilities,
    RunnerRegister,
    Sample,
    TrialReport,
    clip,
)
from runners.client import ApiClient, ApiError, ApiUnreachable, StaleLeaseError
from runners.nvml import GpuProbe
from runners.spool import Spool, Spooled
from runners.uvrun import installed_pythons

Log = Callable[[str], None]

LEASE_WAIT_S = 20.0
GRACE_S = 30.0
IDLE_RETRY_S = 2.0  # after a failed lease request (server down), before the next
# Between deliveries of a spooled report: doubling from 0.5 s up to this, and never more
# than a third of the server's lease: the lease the server renews when it comes back
# (service/queue.py) must still hold when the next delivery lands.
REPORT_RETRY_MAX_S = 10.0
# Worth retrying although 4xx: the server may take the same report later.
RETRY_4XX = {408, 429}


def stderr_log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def parse_labels(text: str | None) -> dict[str, str]:
    """``k=v,k2=v2`` -> dict; ValueError with a one-line message naming the bad item."""
    labels: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"{item!r} is not key=value (write k=v,k2=v2)")
        if key in labels:
            raise ValueError(f"label {key!r} given twice")
        labels[key] = value
    return labels


def make_private_dir(directory: Path) -> None:
    """Create the missing levels of `directory`, each mode 0700; existing ones are left
    (a --state-dir the user made keeps its mode: the spool inside it is 0700 anyway)."""
    missing = []
    while not os.path.lexists(directory) and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for level in reversed(missing):
        # Made meanwhile by another agent on the same state directory: fine.
        with contextlib.suppress(FileExistsError):
            level.mkdir(mode=0o700)


# ---------------------------------------------------------------------------
# capabilities


def describe_capabilities(gpu: GpuProbe | None) -> RunnerCapabilities:
    gpus: list[dict[str, Any]] = []
    driver = cuda = None
    if gpu is not None:
        info = gpu.describe()
        driver, cuda = info.get("driver_version"), info.get("cuda_driver_version")
        gpus = [
            {"name": d.get("name"), "memory_bytes": d.get("memory_total"), "uuid": d.get("uuid")}
            for d in info.get("devices", [])
        ]
    return RunnerCapabilities(
        gpus=gpus,
        gpu_driver=driver,
        cuda=cuda,
        memory_bytes=psutil.virtual_memory().total,
        cpus=os.cpu_count() or 1,
        pythons=installed_pythons(),
        platform=platform.platform(),
    )


# ---------------------------------------------------------------------------
# one trial


class _Trial:
    """A leased trial running in a worker thread, killable from the agent's thread."""

    def __init__(self, lease: Lease, run: Callable[[_Trial], TrialReport]):
        self.lease = lease
        self.spec = lease.trial
        self.memory = LiveFloors()  # fed on the executor's thread, read by the heartbeat
        self.report: TrialReport | None = None
        self.requeue: str | None = None  # why it goes back to the queue, verdictless
        self.killed = False
        self._kill: Kill | None = None
        self._lock = threading.Lock()
        self._run = run
        self.thread = threading.Thread(
            target=self._target, name=f"trial-{self.spec.trial_id}", daemon=True
        )

    def _target(self) -> None:
        try:
            self.report = self._run(self)
        except InfrastructureFailure as exc:  # a failed node is no outcome of the release
            self.requeue = str(exc)
        except Exception as exc:  # noqa: BLE001 - the runner's own failure is the trial's error
            self.report = TrialReport(
                trial_id=self.spec.trial_id,
                attempt=self.spec.attempt,
                env=EnvResult(ok=True),
                error=clip(f"runner: {type(exc).__name__}: {exc}"),
                failure=Failure.from_exception(exc),  # a full disk: the infrastructure's
            )

    def on_start(self, kill: Kill) -> None:
        with self._lock:
            self._kill = kill
            if self.killed:
                kill()

    def on_sample(self, sample: Sample) -> None:
        self.memory.add(sample)

    def kill(self) -> None:
        with self._lock:
            self.killed = True
            if self._kill is not None:
                self._kill()

    @property
    def pgid(self) -> int | None:
        """The script's process group once it runs (local executor), for logs and tests."""
        return getattr(self._kill, "pgid", None)


# ---------------------------------------------------------------------------
# the agent


class Agent:
    def __init__(
        self,
        client: ApiClient,
        name: str,
        labels: dict[str, str],
        executor: Executor,
        gpu: GpuProbe | None,
        *,
        lease_wait: float = LEASE_WAIT_S,
        grace_s: float = GRACE_S,
        log: Log | None = None,
        capabilities: RunnerCapabilities | None = None,
        state_dir: Path | None = None,
        report_retry_max_s: float = REPORT_RETRY_MAX_S,
    ):
        self.client = client
        self.name = name
        self.labels = dict(labels)
        self.executor = executor
        self.gpu = gpu
        self.lease_wait = lease_wait
        self.grace_s = grace_s
        self.log = log or stderr_log
        self._capabilities = capabilities
        if state_dir is not None:
            make_private_dir(state_dir)
        self.spool = Spool(state_dir)
        self.report_retry_max_s = report_retry_max_s
        self.runner_id: str | None = None
        self.heartbeat_s = 10.0
        self.lease_s: float | None = None  # the server's, once registered
        self.stopping = threading.Event()
        self.hurry = threading.Event()  # second signal: no grace period
        self.current: _Trial | None = None
        self.trials_done = 0
        self._left = False

    # -- control

    def stop(self) -> None:
        """Stop taking leases; finish or give back the current trial; then leave."""
        if self.stopping.is_set():
            self.hurry.set()
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT call `stop` (main thread only)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            again = self.stopping.is_set()
            self.stop()
            name = signal.Signals(signum).name
            self.log(f"{name}: {'no grace period' if again else 'stopping'}")

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    @property
    def capabilities(self) -> RunnerCapabilities:
        if self._capabilities is None:
            self._capabilities = describe_capabilities(self.gpu)
        return self._capabilities

    # -- main loop

    def register(self) -> None:
        caps = self.capabilities
        reg = self.client.register(
            RunnerRegister(name=self.name, capabilities=caps, labels=self.labels)
        )
        self.runner_id = reg.runner_id
        self.heartbeat_s = reg.heartbeat_s
        self.lease_s = reg.lease_s
        self._left = False
        gpus = f"{caps.gpu_count} GPU" + ("s" if caps.gpu_count != 1 else "")
        self.log(
            f"registered as {reg.runner_id} ({self.name}) at {self.client.base_url}: "
            f"{gpus}, {caps.cpus} CPUs, pythons {', '.join(caps.pythons[:4])}; "
            f"lease {reg.lease_s:g}s, heartbeat {reg.heartbeat_s:g}s"
        )

    def run(self) -> int:
        """Serve until stopped; returns the exit status (0). Registration errors raise."""
        self._resend_spooled()
        if self.stopping.is_set():
            return 0
        self.register()
        try:
            while not self.stopping.is_set():
                lease = self._poll()
                if lease is not None:
                    self._work(lease)
        finally:
            self._leave()
        return 0

    def _poll(self) -> Lease | None:
        """One long poll, in a helper thread so that `stop` is seen at once."""
        assert self.runner_id is not None
        runner_id = self.runner_id
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["lease"] = self.client.lease(runner_id, wait=self.lease_wait)
            except BaseException as exc:  # noqa: BLE001 - handed to the agent's thread
                box["error"] = exc

        poller = threading.Thread(target=target, name="lease-poll", daemon=True)
        poller.start()
        while poller.is_alive() and not self.stopping.is_set():
            poller.join(0.2)
        if poller.is_alive():
            # Stopping mid-poll: leaving makes the server end the poll (404) and returns any
            # lease granted meanwhile; one that still arrives is given back below.
            self._leave()
            poller.join(2.0)
        error = box.get("error")
        if error is not None:
            self._poll_failed(error)
            return None
        lease: Lease | None = box.get("lease")
        if lease is not None and self.stopping.is_set():
            self._give_back(lease, "stopping")
            return None
        return lease

    def _poll_failed(self, error: BaseException) -> None:
        if self.stopping.is_set():
            return
        if isinstance(error, ApiError) and error.status == 404:
            self.log(f"lease: {error}; registering again")
            self.register()
            return
        if isinstance(error, (ApiError, ApiUnreachable)):
            self.log(f"lease: {error}")
            self.stopping.wait(IDLE_RETRY_S)
            return
        raise error

    def _execute(self, trial: _Trial) -> TrialReport:
        return self.executor.run_trial(
            trial.spec, on_sample=trial.on_sample, on_start=trial.on_start
        )

    def _work(self, lease: Lease) -> None:
        spec = lease.trial
        trial = _Trial(lease, self._execute)
        self.current = trial
        env = spec.env
        self.log(
            f"trial {spec.trial_id} attempt {spec.attempt}: leased {env.package}=={env.version}"
        )
        beat_every = max(0.2, lease.heartbeat_s or self.heartbeat_s)
        next_beat = time.monotonic() + beat_every
        lost: str | None = None
        giving_back = False
        grace_until: float | None = None
        trial.thread.start()
        try:
            while trial.thread.is_alive():
                trial.thread.join(0.1)
                now = time.monotonic()
                if self.stopping.is_set() and grace_until is None and not giving_back:
                    grace = 0.0 if self.hurry.is_set() else self.grace_s
                    grace_until = now + grace
                    self.log(f"trial {spec.trial_id}: stopping; up to {grace:g}s to finish")
                if (
                    grace_until is not None
                    and not giving_back
                    and (now >= grace_until or self.hurry.is_set())
                ):
                    giving_back = True
                    trial.kill()
                    self.log(f"trial {spec.trial_id}: killed (shutting down)")
                if now >= next_beat and trial.thread.is_alive() and lost is None:
                    next_beat = now + beat_every
                    lost = self._heartbeat(trial)
                    if lost is not None:
                        trial.kill()
                        self.log(f"trial {spec.trial_id}: killed: {lost}")
        finally:
            self.current = None
        report = trial.report
        if lost is not None:
            self.log(f"trial {spec.trial_id}: report dropped (lease lost)")
            return
        if giving_back or report is None:
            self._give_back(lease, trial.requeue or "shutting down")
            return
        report = report.model_copy(update={"runner_id": self.runner_id, "attempt": spec.attempt})
        assert self.runner_id is not None
        self._deliver(self.spool.put(report, self.runner_id, self.client.runner_secret))

    def _heartbeat(self, trial: _Trial) -> str | None:
        """Extend the lease; the reason when it is lost (409), else None."""
        assert self.runner_id is not None
        live = trial.memory.state.said()  # one sample's whole state (contract/live.py)
        try:
            self.client.heartbeat(
                trial.spec.trial_id,
                Heartbeat(runner_id=self.runner_id, attempt=trial.spec.attempt, **live),
            )
        except StaleLeaseError as exc:
            return f"lease lost ({exc})"
        except (ApiError, ApiUnreachable) as exc:
            self.log(f"trial {trial.spec.trial_id}: heartbeat failed: {exc}")
        return None

    def _resend_spooled(self) -> None:
        """Send the reports an earlier agent left in the state directory."""
        entries, bad = self.spool.pending()
        for name in bad:
            self.log(f"spool: {name} is unreadable; set aside as .bad")
        for entry in entries:
            self.log(f"trial {entry.trial_id}: resending the spooled report")
            if not self._deliver(entry):
                return  # stopping with the server still away: the rest wait too

    def _deliver(self, entry: Spooled) -> bool:
        """Post a spooled report until the server stores it or refuses it for good (True);
        when stopping meanwhile, leave it spooled for the next start (False)."""
        trial_id, report = entry.trial_id, entry.report
        summary = (
            f"env failed: {report.env.error}"
            if not report.env.ok
            else report.error or f"exit {report.exit_code}, {report.duration_s:.1f}s"
        )
        cap = self.report_retry_max_s
        if self.lease_s:
            cap = min(cap, self.lease_s / 3)
        delay = min(0.5, cap)
        while True:
            try:
                # One try per round: this loop's backoff is the one bounded by the lease.
                answer = self.client.complete(
                    trial_id, report, secret=entry.runner_secret, retries=0
                )
            except StaleLeaseError as exc:
                entry.discard()
                self.log(f"trial {trial_id}: report refused, lease lost ({exc})")
                return True
            except ApiError as exc:
                if exc.status < 500 and exc.status not in RETRY_4XX:
                    entry.discard()
                    self.log(f"trial {trial_id}: report refused: {exc}")
                    return True
                why: str = str(exc)
            except ApiUnreachable as exc:
                why = str(exc)
            else:
                entry.discard()
                self.trials_done += 1
                verdict = (answer or {}).get("verdict", "?")
                if report.infrastructure is not None:  # the server tries it again, or ends
                    verdict = "no verdict: an infrastructure failure"
                self.log(f"trial {trial_id}: done ({summary}): {verdict}")
                return True
            kept = "spooled; " if entry.path is not None else ""
            self.log(f"trial {trial_id}: report not delivered ({why}); {kept}retry in {delay:g}s")
            if self.stopping.wait(delay):
                where = f"; kept in {entry.path}" if entry.path is not None else " (lost)"
                self.log(f"trial {trial_id}: report not delivered before stopping{where}")
                return False
            delay = min(cap, delay * 2)

    def _give_back(self, lease: Lease, why: str) -> None:
        assert self.runner_id is not None
        trial_id = lease.trial.trial_id
        try:
            self.client.give_back(
                trial_id, LeaseReturn(runner_id=self.runner_id, attempt=lease.trial.attempt)
            )
        except (ApiError, ApiUnreachable) as exc:
            self.log(f"trial {trial_id}: could not give the lease back: {exc}")
            return
        self.log(f"trial {trial_id}: lease given back ({why})")

    def _leave(self) -> None:
        if self.runner_id is None or self._left:
            return
        self._left = True
        try:
            self.client.leave(self.runner_id)
        except (ApiError, ApiUnreachable) as exc:
            self.log(f"leave: {exc}")
            return
        self.log(f"left ({self.runner_id}); {self.trials_done} trials reported")
