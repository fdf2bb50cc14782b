"""The one run-watch loop both executors use, its sample sources and what a run gave.

`watch` follows one started run (a local process tree, `runners.executor`; a run-phase
container, `runners.docker.watch`) to its end. What differs between the executors is a
`SampleSource`: how one sample is taken, how the run's end is seen, how the run is ended.
Everything else is here, once:

* Deadline: at ``deadline`` (a `time.monotonic` instant: ``timeout_s`` after the run
  started, for both executors) the run is ended (`SampleSource.stop`) and ``timed_out`` is set.
* Early stop: with `EarlyStop` settings the run's `contract.earlystop.EarlyStopper` looks
  every ``look_every_s`` (the first at ``look_every_s``) at the samples so far and the step
  markers they reach (`contract.earlystop.seen_by_samples`); when it fires the run is
  ended as for a timeout and ``stopped_early`` says why (``timed_out`` stays False).
* The sample rate keeps pace with the run (`Pace`), so a repro whose whole loop takes a
  fraction of a second is read as surely as a paced minute. A run's *age* is the time since
  it started or, once its first step marker came, since that marker, whichever is shorter:
  a long set-up (a framework imported on a busy machine) must not use up the fast start
  before the loop begins.
  - The clock: a reading at once, then every 1/``hz`` s, faster while the run is young
    (`CLOCK`): 100 Hz for its first 2 s, so a run of 0.3 s without markers still has 30
    readings, and 50 Hz until 30 s, so a run of seconds has hundreds; an hour-long run's
    series stays small.
  - The markers: a reading at every step marker, taken as the marker is read (the reader
    thread calls back: `Output.on_marker`) and labelled with the step it starts, so every
    step has a floor however short it is: a 0.3 s run of 50 steps has 50. While the run is
    young (its first ``FAST_S`` s) at most ``MARKER_HZ`` a second on average (a token
    bucket of ``MARKER_BURST``: markers that reach the reader together, as they do when the
    machine is busy, are each read) and at most ``MARKER_BUDGET`` of them; after that no
    closer than the clock's period to the previous reading.
    What a verdict needs is counted in steps (engine/analysis.py: 21 markers of 1 ms or
    more are always enough), and by then the clock alone gives each block its samples.
  A loop that fell behind (suspended, overloaded) does not burst. Each reading carries the
  last step marker seen (None before the first) and goes to ``on_sample`` (a failing
  callback is logged once and never stops the watch). Readings are taken one at a time
  (a lock), so their times never decrease. A reading is labelled right only when the
  marker reader has taken everything the script printed: markers that reach it together
  (it fell behind on a loaded machine) are read at the last of them only, and a clock
  reading due meanwhile waits one period (never two running: `Output.behind`).
* The end: between samples the loop waits on the source's end (`SampleSource.wait_end`),
  so an exit, a kill from another thread or a source that saw its run die ends the loop
  at once.

`Output` reads a run's stdout (step markers, `runners.markers`) and stderr into bounded
tails, the same for both executors; `Execution` is what one run gave.
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
import termios
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
# The clock while the run is young: (age below which, readings a second).
CLOCK = ((2.0, 100.0), (30.0, 50.0))
FAST_S = CLOCK[-1][0]
# Marker readings while the run is young: every step of 1 ms or more gets its reading, up
# to the budget (1000 steps: far more than 30 blocks need). A marker reading costs about
# 0.2 ms of CPU for a small tree (it reads the processes already listed), so a loop of short
# steps costs its runner about 0.2 s of CPU in all (docs/benchmarks.md, section 4).
MARKER_HZ = 1000.0
MARKER_BURST = 20
MARKER_BUDGET = 1000


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


class Lines:
    """``readline`` over a stream of byte chunks (`read_chunk`, b"" at its end), and
    `behind`: whether more output has already come than the reader has taken, so a line
    just read is not the script's latest (`pending` says what waits outside the buffer)."""

    def __init__(
        self, read_chunk: Callable[[], bytes], pending: Callable[[], bool] = lambda: False
    ) -> None:
        self.read_chunk = read_chunk
        self.pending = pending
        self.buf = b""

    @classmethod
    def of_pipe(cls, fd: int) -> Lines:
        """The lines of a pipe read straight from its fd (its unread bytes: FIONREAD)."""
        return cls(lambda: os.read(fd, 65536), lambda: _unread(fd) > 0)

    def readline(self, limit: int = _MAX_LINE) -> bytes:
        while b"\n" not in self.buf and len(self.buf) < limit:
            try:
                chunk = self.read_chunk()
            except (OSError, ValueError, StopIteration):
                chunk = b""
            if not chunk:
                break
            self.buf += chunk
        cut = self.buf.find(b"\n")
        end = cut + 1 if 0 <= cut < limit else min(limit, len(self.buf))
        line, self.buf = self.buf[:end], self.buf[end:]
        return line

    def behind(self) -> bool:
        return b"\n" in self.buf or self.pending()


def _unread(fd: int) -> int:
    """Bytes waiting in a pipe (0 where the kernel will not say)."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return buf[0]


class Output:
    """Reads a run's stdout (markers) and stderr into tails; ``t0`` is the run's clock.

    ``on_marker`` (`Readings.at_marker`) is called on the reader's thread with a marker's
    step, after the marker is recorded, when it is the latest: a reading is taken there.
    Markers that reached the reader together (it fell behind on a loaded machine) were
    printed over some time before, so only the last of them is read: a reading labelled
    with an earlier one would measure a later step, or the script's teardown. `behind`
    says the same to the clock's readings (stdout read through `Lines`; another stream is
    never behind)."""

    def __init__(self, t0: float, on_marker: Callable[[int], None] | None = None):
        self.t0 = t0
        self.lock = threading.Lock()
        self.merged = _Tail(LOG_TAIL_BYTES)
        self.stderr = _Tail(LOG_TAIL_BYTES)
        self.steps: list[tuple[float, int]] = []
        self._last_step = 0
        self.on_marker = on_marker
        self._stdout: object = None

    def behind(self) -> bool:
        """Whether stdout holds output the reader has not taken yet."""
        check = getattr(self._stdout, "behind", None)
        return bool(check()) if check is not None else False

    def read_stdout(self, f: IO[bytes] | Lines) -> None:
        self._stdout = f
        for raw in iter(lambda: f.readline(_MAX_LINE), b""):
            line = raw.decode("utf-8", errors="replace")
            is_marker, n = parse_marker(line)
            if is_marker:
                t = time.monotonic() - self.t0
                step = n if n is not None else self._last_step + 1
                self._last_step = step
                with self.lock:
                    self.steps.append((t, step))
                if self.on_marker is not None and not self.behind():
                    self.on_marker(step)
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


class Pace:
    """When the next reading is due, by the clock or at a marker (the module docstring)."""

    def __init__(self, hz: float, began: float, now: float) -> None:
        self.period = 1.0 / hz
        self.began = began  # when the run started
        self.next_at = now  # a reading at once
        self.loop: float | None = None  # when the first marker came
        self.last = float("-inf")  # when the last reading was taken
        self.at_markers = 0  # marker readings taken while young
        self.tokens = float(MARKER_BURST)  # the marker readings' bucket, filled at MARKER_HZ

    def age(self, now: float) -> float:
        return now - (self.began if self.loop is None else self.loop)

    def clock_period(self, now: float) -> float:
        age = self.age(now)
        fast = [1.0 / hz for below, hz in CLOCK if age < below]
        return min(fast[0], self.period) if fast else self.period

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def first_marker(self, now: float) -> None:
        """The loop begins: the run is young again."""
        if self.loop is None:
            self.loop = now
            self.next_at = min(self.next_at, now + self.clock_period(now))

    def young(self, now: float) -> bool:
        """Marker readings are fast: the run is young and their budget is not spent."""
        return self.age(now) < FAST_S and self.at_markers < MARKER_BUDGET

    def marker_due(self, now: float) -> bool:
        if self.young(now):
            refill = (now - max(self.last, self.began)) * MARKER_HZ
            return self.tokens + refill >= 1.0
        return now - self.last >= self.clock_period(now)

    def defer(self, now: float) -> None:
        """The clock's reading is not taken this time: the next one is due a period on."""
        self.next_at = max(self.next_at, now) + self.clock_period(now)

    def taken(self, now: float, by_clock: bool) -> None:
        refill = (now - max(self.last, self.began)) * MARKER_HZ
        self.tokens = min(float(MARKER_BURST), self.tokens + refill)
        self.last = now
        if not by_clock:
            if self.young(now):
                self.tokens -= 1.0
                self.at_markers += 1
            return
        self.next_at += self.clock_period(self.next_at)
        if self.next_at < now:  # fell behind: do not burst
            self.next_at = now + self.clock_period(now)


class Readings:
    """The run's readings, one at a time: by the watch loop's clock (`tick`) and at each
    marker (`at_marker`, on the stdout reader's thread). Made before the run's output is
    read, so the first markers are read too, however late the watch loop starts on a busy
    machine; closed once the watch ends: a marker read after that is not sampled."""

    def __init__(self, source: SampleSource, args: WatchArgs) -> None:
        self.source, self.args = source, args
        self.seen = Watched()
        self.pace = Pace(args.sample_hz, args.t0, time.monotonic())
        self.report = _Callback(args.on_sample)
        self.lock = threading.Lock()
        self.closed = False
        self.deferred = False  # the last clock reading waited for the marker reader

    def _take(self, step: int | None, by_clock: bool) -> None:
        s = self.source.sample(time.monotonic() - self.args.t0, step)
        if s is not None:
            self.seen.samples.append(s)
            self.report(s)
        self.pace.taken(time.monotonic(), by_clock)

    def tick(self, out: Output) -> None:
        """The watch loop's turn: a reading when the clock says so. Not while the marker
        reader is behind (its label would be a step the script has left), but never two
        ticks running: a script that prints without pause would otherwise starve them."""
        with self.lock:
            if not self.pace.due(time.monotonic()):
                return
            if out.behind() and not self.deferred:
                self.deferred = True
                self.pace.defer(time.monotonic())
                return
            self.deferred = False
            self._take(out.last_step(), by_clock=True)

    def at_marker(self, step: int) -> None:
        with self.lock:
            now = time.monotonic()
            self.pace.first_marker(now)
            if not self.closed and self.pace.marker_due(now):
                self._take(step, by_clock=False)

    def so_far(self) -> list[Sample]:
        """A copy of the samples so far (an early-stop look must not hold up the readings)."""
        with self.lock:
            return list(self.seen.samples)

    def close(self) -> None:
        with self.lock:
            self.closed = True


def watch(readings: Readings, out: Output) -> Watched:
    """Follow one started run to its end (see the module docstring); `out` is the run's
    output, made with ``on_marker=readings.at_marker``."""
    args, source, seen = readings.args, readings.source, readings.seen
    stopper = None if args.early_stop is None else EarlyStopper(args.early_stop)
    next_look = float("inf") if stopper is None else stopper.es.look_every_s
    try:
        while True:
            now = time.monotonic()
            t = now - args.t0
            if now >= args.deadline:
                seen.timed_out = True
                source.stop()
                break
            if stopper is not None and t >= next_look:
                next_look = t + stopper.es.look_every_s
                looked = _look(stopper, readings.so_far(), out, args.memory_limit_bytes)
                if looked is not None:
                    seen.stopped_early = looked
                    source.stop()
                    break
            readings.tick(out)
            wake = min(readings.pace.next_at, args.deadline, args.t0 + next_look)
            if source.wait_end(max(wake - time.monotonic(), 0.0)):
                break
    finally:
        readings.close()
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
