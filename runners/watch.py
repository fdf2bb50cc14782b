"""The one run-watch loop both executors use, its sample sources and what a run gave.

`watch` follows one started run (a local process tree, `runners.executor`; a run-phase
container, `runners.docker.watch`) to its end. What differs between the executors is a
`SampleSource`: how one sample is taken, how the run's end is seen, how the run is ended.
Everything else is here, once:

* Deadline: at ``deadline`` (a `time.monotonic` instant: the local executor's is
  ``timeout_s`` after its wait begins, the container's ``timeout_s`` after it started)
  the run is ended (`SampleSource.stop`) and ``timed_out`` is set.
* Early stop: with `EarlyStop` settings the run's `contract.earlystop.EarlyStopper` looks
  every ``look_every_s`` (the first at ``look_every_s``) at the samples so far and the step
  markers they reach (`contract.earlystop.seen_by_samples`); when it fires the run is
  ended as for a timeout and ``stopped_early`` says why (``timed_out`` stays False).
* The sample clock: a sample at once, then every 1/``hz`` s, at ``FAST_HZ`` during the
  first ``FAST_S`` seconds when ``hz`` is slower (a repro of a few seconds still gets
  enough points per step; an hours-long run's series stays small); a loop that fell
  behind (suspended, overloaded) does not burst. Each sample carries the last step marker
  seen (None before the first) and goes to ``on_sample`` (a failing callback is logged
  once and never stops the watch).
* The end: between samples the loop waits on the source's end (`SampleSource.wait_end`),
  so an exit, a kill from another thread or a source that saw its run die ends the loop
  at once.

`Output` reads a run's stdout (step markers, `runners.markers`) and stderr into bounded
tails, the same for both executors; `Execution` is what one run gave.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Protocol

from contract.earlystop import EarlyStopper, seen_by_samples
from contract.wire import EarlyStop, EarlyStopRecord, Sample
from runners.markers import parse_marker

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 4096
STDERR_TAIL_BYTES = 2048
_MAX_LINE = 64 * 1024  # longer lines are split; a runaway print cannot eat the runner's memory
FAST_HZ = 50.0
FAST_S = 30.0


@dataclass
class Execution:
    """What one run of a script gave, whichever executor ran it."""

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


class Output:
    """Reads a run's stdout (markers) and stderr into tails; ``t0`` is the run's clock."""

    def __init__(self, t0: float):
        self.t0 = t0
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
                continue
            with self.lock:
                self.merged.add(line)

    def read_stderr(self, f: IO[bytes]) -> None:
        for raw in iter(lambda: f.readline(_MAX_LINE), b""):
            line = raw.decode("utf-8", errors="replace")
            with self.lock:
                self.merged.add(line)
                self.stderr.add(line)

    def last_step(self) -> int | None:
        """The step of the last marker so far (None before the first)."""
        with self.lock:
            return self.steps[-1][1] if self.steps else None

    def seen_steps(self) -> list[tuple[float, int]]:
        with self.lock:
            return list(self.steps)

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


class SampleSource(Protocol):
    """What `watch` needs of one executor's run."""

    def sample(self, t: float, step: int | None) -> Sample | None:
        """One sample at `t` (seconds since the run's start) carrying `step`; None when
        there was nothing to sample this time."""
        ...

    def wait_end(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the run to end; True once it has ended (exited,
        killed from another thread, or seen gone by `sample`)."""
        ...

    def stop(self) -> None:
        """End the run now (its deadline passed or the early-stop rule fired)."""
        ...


@dataclass
class Watched:
    """What the loop saw: every sample taken and why it ended."""

    samples: list[Sample] = field(default_factory=list)
    timed_out: bool = False
    stopped_early: str | None = None  # why the early-stop rule ended the run
    early_stop: EarlyStopRecord | None = None  # its horizon and looks (None: no settings)


@dataclass
class WatchArgs:
    """The run's clock and rules: started at ``t0``, timed out at ``deadline`` (both
    `time.monotonic` instants); samples and looks count seconds from ``t0``."""

    t0: float
    deadline: float
    sample_hz: float
    memory_limit_bytes: int
    early_stop: EarlyStop | None = None
    on_sample: Callable[[Sample], None] | None = None


class _Clock:
    """When the next sample is due (see the module docstring)."""

    def __init__(self, hz: float, began: float) -> None:
        self.period = 1.0 / hz
        self.fast = min(self.period, 1.0 / FAST_HZ)
        self.began = self.next_at = began

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def advance(self, now: float) -> None:
        self.next_at += self.fast if self.next_at - self.began < FAST_S else self.period
        if self.next_at < now:  # fell behind: do not burst
            self.next_at = now + self.period


def watch(source: SampleSource, out: Output, args: WatchArgs) -> Watched:
    """Follow one started run to its end (see the module docstring)."""
    seen = Watched()
    stopper = None if args.early_stop is None else EarlyStopper(args.early_stop)
    next_look = float("inf") if stopper is None else stopper.es.look_every_s
    clock = _Clock(args.sample_hz, time.monotonic())
    report = _Callback(args.on_sample)
    while True:
        now = time.monotonic()
        t = now - args.t0
        if now >= args.deadline:
            seen.timed_out = True
            source.stop()
            break
        if stopper is not None and t >= next_look:
            next_look = t + stopper.es.look_every_s
            seen.stopped_early = _look(stopper, seen.samples, out, args.memory_limit_bytes)
            if seen.stopped_early is not None:
                source.stop()
                break
        if clock.due(now):
            s = source.sample(time.monotonic() - args.t0, out.last_step())
            if s is not None:
                seen.samples.append(s)
                report(s)
            clock.advance(time.monotonic())
        wake = min(clock.next_at, args.deadline, args.t0 + next_look)
        if source.wait_end(max(wake - time.monotonic(), 0.0)):
            break
    seen.early_stop = None if stopper is None else stopper.record()
    return seen


def _look(stopper: EarlyStopper, samples: list[Sample], out: Output, limit: int) -> str | None:
    """One look of the run's `EarlyStopper` at the samples and markers so far."""
    steps = seen_by_samples(out.seen_steps(), samples[-1].step if samples else None)
    return stopper.look([s.t for s in samples], [s.rss for s in samples], steps, limit)


class _Callback:
    """``on_sample``, kept from stopping the watch: a display's failure is logged once."""

    def __init__(self, fn: Callable[[Sample], None] | None) -> None:
        self.fn = fn
        self.failed = False

    def __call__(self, s: Sample) -> None:
        if self.fn is None:
            return
        try:
            self.fn(s)
        except Exception:  # noqa: BLE001 - a display callback must not stop the watch
            if not self.failed:
                self.failed = True
                log.exception("on_sample callback failed")
