"""Runs one repro script as a local subprocess, supervised, capped and sampled.

`run_script` starts ``python script`` under its supervisor (`runners.supervise`,
`runners.shim`: a child subreaper that runs the script as the trial user when the
runner is root, reaps every orphan and kills whatever is left when the script ends),
inside a `MemoryCap` (cgroup v2, else cgroup v1, else the sampler's watchdog; with a
pids limit), samples the supervisor's descendants (never the supervisor, nor the init of
the script's PID namespace: `runners.shim.Init`, which the supervisor names) with a
`Sampler` that re-lists the tree at every sample and adds the cgroup's process list,
parses step markers from stdout, and returns an `Execution`. The runner process
itself becomes a child subreaper as a backstop (`runners.sandbox.become_subreaper`).

Every trial runs under a cap: when ``memory_limit_bytes`` is None the cap is
`runners.limits.default_limit_bytes()`, 80% of the memory available to the
runner (the machine's available memory, or the head-room under the runner's
own cgroup limit when that is smaller).

Outcomes:

* ``exit_code`` is the script's exit status, passed through exactly (125 means "skip
  this candidate" to the classifier); a signal death is ``-signum``. A script that
  could not be started has ``exit_code`` None and ``error`` set.
* Killed by the cap: ``oom_killed=True`` and ``exit_code == -9``. (With cgroup
  v1 the kernel kills the largest task only; if that was a worker and the
  script then exits on its own, ``oom_killed`` is True and the script's own
  exit code is kept.)
* Past ``timeout_s``: the whole tree is SIGKILLed, ``timed_out=True``.
* Stopped early: with ``early_stop`` the trial's `contract.earlystop.EarlyStopper` looks
  every ``look_every_s`` while the script runs, over the samples and the step markers they
  reach (`contract.earlystop.seen_by_samples`); when it fires the tree is ended as for a
  timeout and ``stopped_early`` says why (``timed_out`` stays False). ``early_stop`` on the
  `Execution` records its horizon and the leak looks it tested.
* Isolation: the script runs in namespaces of its own (`runners.shim`: PID, as pid 2
  under an init that reaps its orphans and passes its exit status or signal through
  unchanged; mount with a private /tmp and /dev/shm, network with only its own
  loopback, IPC) where the kernel and the runner's rights allow;
  ``missing_protections`` lists, one phrase each, what it did not get (all of them, and
  `NO_OWN_USER`, for a runner that is not root).
* After the script exits, whatever it left running (double forks, ``setsid``
  daemons, processes in its cgroup) is killed: a trial leaves no processes behind.
  A process that left the trial's memory cgroup is killed on sight. ``cap_notes``
  says what happened beyond the plain exit.

``env`` is the script's complete environment as with `subprocess.Popen` (None: the
allowlist of `runners.sandbox.allowed_env` with HOME = ``cwd``); ``BISECT_*``
variables are always removed and ``PYTHONUNBUFFERED=1`` is added unless set so that
step markers arrive on time. ``on_sample`` is called from the sampler thread with
every sample (for live displays); keep it quick.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import psutil

from contract.earlystop import EarlyStopper, seen_by_samples
from contract.wire import EarlyStop, EarlyStopRecord, Sample
from runners.limits import DEFAULT_PIDS_LIMIT, CapMethod, MemoryCap, default_limit_bytes
from runners.markers import parse_marker
from runners.nvml import GpuProbe
from runners.sampler import Sampler
from runners.sandbox import allowed_env, become_subreaper, scrub
from runners.supervise import Outcome, Supervised
from runners.users import Identity, identities, processes

LOG_TAIL_BYTES = 4096
STDERR_TAIL_BYTES = 2048
_MAX_LINE = 64 * 1024  # longer lines are split; a runaway print cannot eat the runner's memory
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)
NO_OWN_USER = "no user of its own (runs as the runner's uid)"


@dataclass
class Execution:
    exit_code: int | None
    oom_killed: bool
    timed_out: bool
    cap_method: str
    duration_s: float
    log_tail: str
    samples: list[Sample] = field(default_factory=list)
    steps: list[tuple[float, int]] = field(default_factory=list)
    gpu_source: str = "unavailable"
    host_source: str = "psutil"
    stderr_tail: str = ""
    memory_limit_bytes: int = 0
    peak_rss: int = 0
    cgroup_peak_bytes: int | None = None
    oom_kill_count: int | None = None
    cap_notes: list[str] = field(default_factory=list)
    error: str | None = None  # the script could not be started (exit_code is then None)
    pids_limit: int | None = None
    stopped_early: str | None = None  # why the early-stop rule ended the trial
    early_stop: EarlyStopRecord | None = None  # its horizon and looks (None: no settings)
    missing_protections: list[str] = field(default_factory=list)  # isolation it did not get


class _Tail:
    """The last ``limit`` characters of a stream of lines."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lines: deque[str] = deque()
        self.size = 0

    def add(self, line: str) -> None:
        if len(line) > self.limit:
            line = line[-self.limit :]
        self.lines.append(line)
        self.size += len(line)
        while self.size > self.limit and len(self.lines) > 1:
            self.size -= len(self.lines.popleft())

    def text(self) -> str:
        s = "".join(self.lines)
        return s[-self.limit :]


class _Output:
    """Reads the child's stdout (markers) and stderr into tails."""

    def __init__(self, t0: float, on_step: Callable[[int], None]):
        self.t0 = t0
        self.on_step = on_step
        self.lock = threading.Lock()
        self.merged = _Tail(LOG_TAIL_BYTES)
        self.stderr = _Tail(LOG_TAIL_BYTES)
        self.steps: list[tuple[float, int]] = []
        self._last_step = 0

    def read_stdout(self, f: IO[bytes]) -> None:
        for raw in iter(lambda: f.readline(_MAX_LINE), b""):
            line = raw.decode("utf-8", errors="replace")
            is_marker, n = parse_marker(line)
            if is_marker:
                t = time.monotonic() - self.t0
                step = n if n is not None else self._last_step + 1
                self._last_step = step
                with self.lock:
                    self.steps.append((t, step))
                self.on_step(step)
                continue
            with self.lock:
                self.merged.add(line)

    def read_stderr(self, f: IO[bytes]) -> None:
        for raw in iter(lambda: f.readline(_MAX_LINE), b""):
            line = raw.decode("utf-8", errors="replace")
            with self.lock:
                self.merged.add(line)
                self.stderr.add(line)

    def log_tail(self, crashed: bool) -> str:
        with self.lock:
            merged = self.merged.text()
            err = self.stderr.text()
        if not crashed or not err:
            return merged
        err = err[-STDERR_TAIL_BYTES:]
        if err in merged:
            return merged
        # Chatty stdout pushed the traceback out of the merged tail: keep both halves.
        keep = LOG_TAIL_BYTES - len(err) - 40
        head = merged[-keep:] if keep > 0 else ""
        return f"{head}\n[... stderr tail ...]\n{err}"


class TrialKill:
    """Ends a running trial from any thread (a lost lease, a stopping runner).

    ``pgid`` is the trial's process group: its supervisor's, which is also the
    supervisor's pid and session (logs and tests read it). Calling it asks the
    supervisor to kill the whole tree; `run_script` then returns as for any killed
    script.
    """

    def __init__(self, supervised: Supervised) -> None:
        self._supervised = supervised
        self.pgid = supervised.pid

    def __call__(self) -> None:
        self._supervised.stop()


def nproc_limit(who: Identity | None, pids_limit: int) -> int:
    """RLIMIT_NPROC for a trial without a pids cgroup.

    The kernel counts every task (thread) of the *real uid*, across the machine, so the
    figure is what that uid runs now plus ``pids_limit``: the trial gets its
    ``pids_limit`` and the uid's other processes (the runner's own, when it is not
    root; concurrent trials share the trial user's count) are not starved.
    """
    uid = who.uid if who is not None else os.getuid()
    tasks = sum(
        int(fields.get(b"Threads", b"1").strip() or 1)
        for _, fields in processes()
        if int(fields.get(b"Uid", b"-1").split()[0]) == uid
    )
    return tasks + pids_limit


def _sweep(procs: Iterable[psutil.Process]) -> int:
    """Kill every trial process still alive and reap those re-parented to the runner.

    Only needed when the supervisor died before its own clean-up (SIGKILLed by a
    same-uid script or a v2 OOM group kill): the runner, a child subreaper, then
    inherits the orphans. psutil checks each process's start time, so a reused pid is
    never touched. Returns how many were still alive.
    """
    me, alive = os.getpid(), 0
    procs = list(procs)
    for p in procs:
        with contextlib.suppress(*_GONE):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive += 1
                p.kill()
    for p in procs:
        with contextlib.suppress(*_GONE, ChildProcessError):
            if p.is_running() and p.ppid() == me:
                os.waitpid(p.pid, 0)
    return alive


class _ScriptRun:
    """One script under its supervisor, cap, sampler and output readers."""

    def __init__(
        self,
        cap: MemoryCap,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        run_as: Identity | None,
        pids_limit: int | None,
    ) -> None:
        self.cap = cap
        self.pids_limit = pids_limit
        nproc = None
        if pids_limit is not None and cap.pids_limit is None:
            nproc = nproc_limit(run_as, pids_limit)
        self.supervised = Supervised(
            argv,
            cwd=cwd,
            env=env,
            run_as=run_as,
            nproc=nproc,
            join=cap.preexec if cap.dirs else None,
            isolate=True,
        )
        self.run_as = run_as
        self.timed_out = False
        self.stopped_early: str | None = None
        self.stopper: EarlyStopper | None = None
        self.t0 = 0.0
        self.duration = 0.0
        self.swept = 0

    def start(
        self, *, sample_hz: float, gpu: GpuProbe | None, on_sample: Callable[[Sample], None] | None
    ) -> None:
        cap = self.cap
        self.t0 = time.monotonic()
        proc = self.supervised.start()
        watchdog = cap.method == "watchdog"
        self.sampler = Sampler(
            proc.pid,
            hz=sample_hz,
            gpu=gpu,
            start_time=self.t0,
            refresh_s=0.0,  # every sample: a double fork cannot hide between refreshes
            include_root=False,  # the supervisor is not the trial
            exclude=() if self.supervised.init_pid is None else (self.supervised.init_pid,),
            listed=cap.pids if cap.dirs else None,
            inside=cap.memory_pids if cap.path is not None else None,
            watchdog_limit_bytes=cap.limit_bytes if watchdog else None,
            pids_limit=self.pids_limit if cap.pids_limit is None else None,
            on_watchdog=self._watchdog,
            on_sample=on_sample,
        )
        self.out = _Output(self.t0, self.sampler.set_step)
        assert proc.stdout is not None and proc.stderr is not None
        self.readers = [
            threading.Thread(target=self.out.read_stdout, args=(proc.stdout,), daemon=True),
            threading.Thread(target=self.out.read_stderr, args=(proc.stderr,), daemon=True),
        ]
        for r in self.readers:
            r.start()
        self.sampler.start()

    def _watchdog(self) -> None:
        self.cap.trip()
        self.supervised.stop()

    def wait(self, timeout_s: float, early_stop: EarlyStop | None = None) -> None:
        """Until the script exits, the timeout passes or the early-stop rule fires."""
        deadline = time.monotonic() + timeout_s
        self.stopper = None if early_stop is None else EarlyStopper(early_stop)
        while True:
            left = deadline - time.monotonic()
            chunk = left if early_stop is None else min(left, early_stop.look_every_s)
            if self.supervised.wait(max(chunk, 0.0)):
                return
            if time.monotonic() >= deadline:
                self.timed_out = True
                self.stop()
                return
            reason = self._look()
            if reason is not None:
                self.stopped_early = reason
                self.stop()
                return

    def _look(self) -> str | None:
        """One look of the trial's `EarlyStopper` at the samples and markers so far."""
        assert self.stopper is not None
        samples = list(self.sampler.samples)  # a copy: the sampler thread appends
        steps = seen_by_samples(list(self.out.steps), samples[-1].step if samples else None)
        return self.stopper.look(
            [x.t for x in samples], [x.rss for x in samples], steps, self.cap.limit_bytes
        )

    def stop(self) -> None:
        """End the tree now (timeout, interrupt) and wait for the supervisor."""
        self.supervised.stop()
        self.supervised.wait_stopped()

    def finish(self) -> None:
        """After the supervisor exited: nothing of the trial survives it."""
        self.duration = time.monotonic() - self.t0
        self.sampler.stop()
        self.cap.kill_all()
        self.swept = _sweep(self.sampler.seen.values())
        for r in self.readers:
            r.join(timeout=5.0)
        if not any(r.is_alive() for r in self.readers):
            # (A reader still blocked holds the file's lock: closing would hang; leave it.)
            proc = self.supervised.proc
            assert proc is not None
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()

    def notes(self, outcome: Outcome) -> list[str]:
        notes = list(self.cap.notes)
        if self.sampler.watchdog_reason:
            notes.append(f"watchdog killed the trial: {self.sampler.watchdog_reason}")
        notes += [f"pid {p} left the trial's cgroup: killed" for p in self.sampler.escaped]
        refused = self.cap.forks_refused()
        if refused:
            notes.append(f"the pids limit ({self.cap.pids_limit}) refused {refused} forks")
        proc = self.supervised.proc
        if not outcome.reported and proc is not None:
            notes.append(f"the supervisor died without a report (status {proc.returncode})")
        if self.swept:
            notes.append(f"{self.swept} processes outlived the supervisor: killed")
        return notes

    def execution(self, gpu: GpuProbe | None) -> Execution:
        outcome = self.supervised.outcome()
        exit_code = outcome.exit_code
        crashed = exit_code not in (0, 125)
        log_tail = self.out.log_tail(crashed)
        if outcome.error is not None:
            log_tail = f"{log_tail}{outcome.error}\n"
        s = self.sampler
        return Execution(
            exit_code=exit_code,
            oom_killed=self.cap.oom_killed(exit_code),
            timed_out=self.timed_out,
            cap_method=self.cap.method,
            duration_s=self.duration,
            log_tail=log_tail[-LOG_TAIL_BYTES:],
            samples=list(s.samples),
            steps=list(self.out.steps),
            gpu_source=s.gpu_source if gpu is not None else "unavailable",
            host_source="psutil",
            stderr_tail=self.out.stderr.text()[-STDERR_TAIL_BYTES:],
            memory_limit_bytes=self.cap.limit_bytes,
            peak_rss=s.peak_rss,
            cgroup_peak_bytes=self.cap.peak_bytes(),
            oom_kill_count=self.cap.oom_kill_count(),
            cap_notes=self.notes(outcome),
            error=outcome.error,
            pids_limit=self.cap.pids_limit or self.pids_limit,
            stopped_early=self.stopped_early,
            early_stop=None if self.stopper is None else self.stopper.record(),
            missing_protections=self.missing(outcome),
        )

    def missing(self, outcome: Outcome) -> list[str]:
        """What isolation the script did not get: `NO_OWN_USER` and what the supervisor
        reported (`runners.shim.PROTECTIONS`; a runner that is not root gets none of them)."""
        own = [] if self.run_as is not None else [NO_OWN_USER]
        return own + list(outcome.missing)


def script_env(env: Mapping[str, str] | None, cwd: Path) -> dict[str, str]:
    """The script's environment: `env` as given (None: the allowlist, HOME = `cwd`),
    never a ``BISECT_*`` variable, ``PYTHONUNBUFFERED=1`` unless set."""
    child = dict(env) if env is not None else allowed_env(home=cwd)
    child.setdefault("PYTHONUNBUFFERED", "1")
    return scrub(child)


def run_script(
    python: str,
    script: Path,
    *,
    cwd: Path,
    timeout_s: float,
    memory_limit_bytes: int | None,
    sample_hz: float = 10.0,
    env: dict[str, str] | None = None,
    gpu: GpuProbe | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    cap_method: CapMethod | None = None,
    name: str | None = None,
    on_start: Callable[[TrialKill], None] | None = None,
    run_as: Identity | None | Literal["auto"] = "auto",
    pids_limit: int | None = DEFAULT_PIDS_LIMIT,
    early_stop: EarlyStop | None = None,
    args: Sequence[str] = (),
) -> Execution:
    """Run ``python script [args]`` in ``cwd`` under its supervisor, a memory cap and the sampler.

    ``cap_method`` forces a `MemoryCap` method (tests force "watchdog"); ``name``
    labels the cgroup (default: the script's stem). ``run_as``: the user the script
    runs as; "auto" is the trial user when the runner is root (`runners.users`) and
    the runner's own uid otherwise; None is always the runner's own uid. ``cwd`` and
    the script must be usable by that user. ``pids_limit``: processes and threads
    the trial may have at once (`runners.limits.DEFAULT_PIDS_LIMIT`; None: no limit).
    ``on_start`` receives a `TrialKill` once the script runs; calling it (from any
    thread) ends the trial, and this function then returns as for any killed script.
    ``early_stop``: the early-stop settings (None: run to the end or the timeout).
    """
    limit = memory_limit_bytes if memory_limit_bytes is not None else default_limit_bytes()
    ids = identities()
    who = ids.trial if run_as == "auto" else run_as
    become_subreaper({u.uid for u in [*ids.users, *([who] if who else [])]})
    label = name or Path(script).stem
    with MemoryCap.create(limit, label, method=cap_method, pids_limit=pids_limit) as cap:
        run = _ScriptRun(
            cap, [python, str(script), *args], cwd=cwd, env=script_env(env, cwd), run_as=who,
            pids_limit=pids_limit,
        )  # fmt: skip
        run.start(sample_hz=sample_hz, gpu=gpu, on_sample=on_sample)
        try:
            if on_start is not None:
                on_start(TrialKill(run.supervised))
            run.wait(timeout_s, early_stop)
        except BaseException:
            # Interrupted (KeyboardInterrupt, a stale lease...): never leave the tree running.
            run.stop()
            run.finish()
            raise
        run.finish()
        return run.execution(gpu)
