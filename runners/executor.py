"""Runs one repro script as a local subprocess, supervised, capped and sampled.

`run_script` starts ``python script`` under its supervisor (`runners.supervise`,
`runners.shim`: a child subreaper that runs the script as the trial user when the
runner is root, reaps every orphan and kills whatever is left when the script ends),
inside a `MemoryCap` (cgroup v2, else cgroup v1, else the sampler's watchdog; with a
pids limit), samples the supervisor's descendants (never the supervisor, nor the init of
the script's PID namespace: `runners.shim.Init`, which the supervisor names) with a
`Sampler` that re-lists the tree at every sample and adds the cgroup's process list,
parses step markers from stdout, and returns an `Execution`. The run is followed by
the watch loop both executors share (`runners.watch`: deadline, early-stop looks, the
sample clock), with the process tree as its sample source (`_TreeSource`). The runner
process itself becomes a child subreaper as a backstop (`runners.sandbox.become_subreaper`).

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
step markers arrive on time. ``on_sample`` is called from the watch loop (the calling
thread) with every sample (for live displays); keep it quick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from contract.wire import EarlyStop, Sample
from runners.limits import DEFAULT_PIDS_LIMIT, CapMethod, MemoryCap, default_limit_bytes
from runners.nvml import GpuProbe
from runners.sampler import Sampler
from runners.sandbox import allowed_env, become_subreaper, scrub
from runners.supervise import Outcome, Supervised
from runners.users import Identity, identities, processes
from runners.watch import (
    LOG_TAIL_BYTES,
    STDERR_TAIL_BYTES,
    Execution,
    Lines,
    Output,
    Readings,
    WatchArgs,
    Watched,
    watch,
)

log = logging.getLogger(__name__)

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)
NO_OWN_USER = "no user of its own (runs as the runner's uid)"
# How often a trial's tree is re-listed (its cgroup's processes, its descendants; escapes
# killed): at most every 20 ms, so a double fork hides no longer than that. A re-listing
# costs about 0.6 ms of CPU, a reading of the listed processes about 0.1 ms: the readings
# at each step marker and the young run's 100 Hz clock mostly read between re-listings
# (docs/benchmarks.md section 4).
REFRESH_S = 0.02


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


class _TreeSource:
    """The `runners.watch.SampleSource` of a local run: its process tree, sampled by its
    `Sampler` (which also kills escapes and trips the watchdog), ended by its supervisor."""

    def __init__(self, run: _ScriptRun) -> None:
        self.run = run

    def sample(self, t: float, step: int | None) -> Sample | None:
        # `t` is left to the sampler: it stamps the sample when the tree has been read.
        try:
            return self.run.sampler.take(step)
        except Exception:  # noqa: BLE001 - keep watching; a surprise is logged, not fatal
            log.exception("sampling the trial's tree failed")
            return None

    def wait_end(self, timeout: float) -> bool:
        return self.run.supervised.wait(timeout)

    def stop(self) -> None:
        self.run.stop()


@dataclass(frozen=True)
class _Rules:
    """How a run is watched: its timeout (from its start), sample rate, early stop, callback."""

    timeout_s: float
    sample_hz: float
    early_stop: EarlyStop | None
    on_sample: Callable[[Sample], None] | None


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
        self.seen = Watched()
        self.t0 = 0.0
        self.duration = 0.0
        self.swept = 0

    def start(self, rules: _Rules, gpu: GpuProbe | None) -> None:
        """Start the script, its sampler and its output readers (after `Readings`, so
        every marker is read); `rules` are the watch's (`wait`)."""
        cap = self.cap
        sample_hz = rules.sample_hz
        self.t0 = time.monotonic()
        proc = self.supervised.start()
        watchdog = cap.method == "watchdog"
        self.sampler = Sampler(
            proc.pid,
            hz=sample_hz,  # the watch loop keeps the pace; the sampler checks the rate
            gpu=gpu,
            start_time=self.t0,
            refresh_s=REFRESH_S,
            include_root=False,  # the supervisor is not the trial
            exclude=() if self.supervised.init_pid is None else (self.supervised.init_pid,),
            listed=cap.pids if cap.dirs else None,
            inside=cap.memory_pids if cap.path is not None else None,
            watchdog_limit_bytes=cap.limit_bytes if watchdog else None,
            pids_limit=self.pids_limit if cap.pids_limit is None else None,
            on_watchdog=self._watchdog,
        )
        self.sampler.attach()
        args = WatchArgs(t0=self.t0, deadline=self.t0 + rules.timeout_s, sample_hz=sample_hz,
                         memory_limit_bytes=cap.limit_bytes, early_stop=rules.early_stop,
                         on_sample=rules.on_sample)  # fmt: skip
        self.readings = Readings(_TreeSource(self), args)
        self.out = Output(self.t0, on_marker=self.readings.at_marker)
        assert proc.stdout is not None and proc.stderr is not None
        self.readers = [
            # Straight from the pipe's fd: the reader knows when it is behind (watch.Lines).
            threading.Thread(target=self.out.read_stdout,
                             args=(Lines.of_pipe(proc.stdout.fileno()),), daemon=True),
            threading.Thread(target=self.out.read_stderr, args=(proc.stderr,), daemon=True),
        ]
        for r in self.readers:
            r.start()

    def _watchdog(self) -> None:
        self.cap.trip()
        self.supervised.stop()

    def wait(self) -> None:
        """Until the script exits, the timeout passes or the early-stop rule fires
        (`runners.watch.watch`)."""
        self.seen = watch(self.readings, self.out)

    def stop(self) -> None:
        """End the tree now (timeout, early stop, interrupt) and wait for the supervisor."""
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
            timed_out=self.seen.timed_out,
            cap_method=self.cap.method,
            duration_s=self.duration,
            log_tail=log_tail[-LOG_TAIL_BYTES:],
            samples=self.seen.samples,
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
            stopped_early=self.seen.stopped_early,
            early_stop=self.seen.early_stop,
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
        run.start(_Rules(timeout_s, sample_hz, early_stop, on_sample), gpu)
        try:
            if on_start is not None:
                on_start(TrialKill(run.supervised))
            run.wait()
        except BaseException:
            # Interrupted (KeyboardInterrupt, a stale lease...): never leave the tree running.
            run.stop()
            run.finish()
            raise
        run.finish()
        return run.execution(gpu)
