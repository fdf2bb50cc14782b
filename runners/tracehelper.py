"""Run a repro script under an allocation tracer and write its per-stack profile as JSON.

    PYTHON tracehelper.py TRACER OUT SCRIPT [MARKERS SECONDS]

Runs in the trial's own interpreter, beside the script, so it imports nothing but the
standard library (and memray, which the runner added to the trial's environment for the
"memray" tracer). The profile it writes to OUT (`engine/attribution.py` reads it):

    {"tracer": ..., "snapshots": [{"t": s, "step": n | null, "marker": i}, ...],
     "stacks": [{"frames": [[file, line, function], ...], "sizes": [bytes, ...]}, ...],
     "markers": step markers seen, "limits": {"markers": M | null, "seconds": S | null},
     "stopped": null | {"by": "markers" | "seconds" | "signal", "markers": i, "seconds": s},
     "error": null | "why no profile"}

``frames`` are outermost first, innermost (the allocating line) last; ``file`` is relative
to site-packages where it lies there (so the same line compares across environments);
``sizes[i]`` is the stack's live bytes at ``snapshots[i]``; a snapshot's ``marker`` is how
many step markers the script had printed when it was taken.

Stopping (`Limits`): MARKERS and SECONDS (0: none; `engine/attribution.py`
`trace_stop` chooses them) end the traced run before the script ends: once the script
has printed MARKERS step markers (the comparison has what it needs), or SECONDS after
the helper started (the budget), or on SIGTERM/SIGINT (the runner stopping it). The
helper raises `Stop` in the script's main thread, from the marker's print or from a
signal handler (a timer signals the process): a BaseException, so the script's
``except Exception`` does not swallow it, and its ``finally`` blocks and context
managers still run. It then writes the profile as always, whole: to OUT.tmp, renamed
to OUT (a killed helper leaves no OUT, never half of one), and exits 0 at once
(``os._exit``: a stopped script's non-daemon threads would keep the process alive).
A script that raises is reported with its traceback and exit status 1, and its profile
is written too.

* ``tracemalloc``: Python allocations, snapshots at each step marker the script prints
  (no closer than `MIN_GAP_S` apart, nor than five times the CPU time the last snapshot
  took, so snapshots never take more than a sixth of the run's CPU; CPU, not wall time,
  so that a loaded machine does not space them out), every `INTERVAL_S` while it
  prints none, and once at the end (unless it stopped at a marker's snapshot); the
  snapshots before the first marker are dropped when it comes (set-up is never judged),
  then thinned to `MAX_SNAPSHOTS`.
* ``memray``: native stacks (``native_traces``) of everything allocated and still live
  at the end, captured in memray's aggregated format (per stack, not per allocation, so
  the capture stays small however long the run): one snapshot. Its stacks are hybrid:
  the script's Python frames with the native frames below and between them. Growth
  across steps shows as live bytes that the last good release does not have (the
  comparison subtracts it).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import linecache
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterator

STEP_MARKER = "::leakbisect-step::"
NFRAMES = 12  # tracemalloc's: Python frames only
MEMRAY_FRAMES = 100  # memray's hybrid stacks: native frames too
MIN_GAP_S = 0.2
INTERVAL_S = 1.0
MAX_SNAPSHOTS = 24
MIN_STACK_BYTES = 4096  # smaller stacks are not kept per snapshot
MAX_STACKS = 60  # in the profile: the ones that grew most from the first snapshot
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def relative(path: str) -> str:
    """A file as the comparison matches it: after the last site-packages, or its name."""
    marker = "site-packages" + os.sep
    if marker in path:
        return path.rsplit(marker, 1)[1]
    return path if path.startswith("<") else os.path.basename(path)


def from_script(frames: list[list], script: str) -> list[list]:
    """`frames` (outermost first) from the script's outermost frame on: this helper's,
    runpy's and the interpreter's own frames above it say nothing about the leak."""
    name = os.path.basename(script)
    for i, frame in enumerate(frames):
        if frame[0] == name:
            return frames[i:]
    return frames


def function_at(path: str, line: int) -> str:
    """The name of the innermost `def` that holds `line` (tracemalloc frames carry none)."""
    if path not in _DEFS:
        try:
            tree = ast.parse("".join(linecache.getlines(path)))
        except (SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        _DEFS[path] = [
            (node.lineno, node.end_lineno or node.lineno, node.name)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
    holding = [(start, name) for start, end, name in _DEFS[path] if start <= line <= end]
    return max(holding)[1] if holding else "<module>"


_DEFS: dict[str, list[tuple[int, int, str]]] = {}


class Stop(BaseException):
    """Ends the script early: raised in its main thread (see the module docstring)."""


class Limits:
    """When the traced run ends before the script does, and why it did (`stopped`)."""

    def __init__(self, markers: int = 0, seconds: float = 0.0) -> None:
        self.markers = markers if markers > 0 else None
        self.seconds = seconds if seconds > 0 else None
        self.t0 = time.monotonic()
        self.seen = 0
        self.stopped: dict | None = None
        self.armed = False
        self.timer: threading.Timer | None = None
        self.holding = False  # the main thread is writing stdout: a stop waits (`held`)
        self.deferred = False

    def arm(self) -> None:
        """From the main thread, before the script runs: signals and the deadline."""
        self.armed = True
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        if self.seconds is not None:
            left = self.seconds - (time.monotonic() - self.t0)
            self.timer = threading.Timer(max(0.0, left), self.stop, ("seconds",))
            self.timer.daemon = True
            self.timer.start()

    def disarm(self) -> None:
        """The script has ended: nothing raises in the helper's own code after this."""
        self.armed = False
        if self.timer is not None:
            self.timer.cancel()

    def ended(self) -> None:
        """The script ended by itself: a stop that raced its end never happened."""
        self.disarm()
        self.stopped = None

    def reached(self) -> None:
        """Stop here when the script has printed the markers it needed."""
        if self.markers is not None and self.seen >= self.markers:
            self.stop("markers")

    def stop(self, by: str) -> None:
        """End the script: at once from its main thread, else through a signal to it."""
        if not self.armed:
            return
        self._record(by)
        if threading.current_thread() is threading.main_thread():
            self._raise()
        else:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While the main thread writes and counts a marker, a stop waits for its end, so
        the markers counted are those the runner read."""
        main = threading.current_thread() is threading.main_thread()
        self.holding = self.holding or main
        try:
            yield
        finally:
            if main:
                self.holding = False
                if self.deferred:
                    self.deferred = False
                    self._raise()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._record("signal")
        if self.holding:
            self.deferred = True
        else:
            self._raise()

    def _record(self, by: str) -> None:
        if self.stopped is None and self.armed:
            took = round(time.monotonic() - self.t0, 3)
            self.stopped = {"by": by, "markers": self.seen, "seconds": took}

    def _raise(self) -> None:
        if self.armed:  # once: the handler that raises disarms first
            self.disarm()
            raise Stop

    def record(self) -> dict:
        """The profile's account: markers seen, the limits it had, and why it stopped."""
        limits = {"markers": self.markers, "seconds": self.seconds}
        stopped = None if self.stopped is None else {**self.stopped, "markers": self.seen}
        return {"markers": self.seen, "limits": limits, "stopped": stopped}


class Snapshots:
    """tracemalloc snapshots at step markers (stdout is wrapped) or on a timer."""

    def __init__(self, helper: str, limits: Limits) -> None:
        self.t0 = limits.t0
        self.limits = limits
        # (time and step, sizes) pairs, appended whole: a `Stop` can land anywhere.
        self.taken: list[tuple[dict, dict[tuple, int]]] = []
        self.last = -MIN_GAP_S
        self.lock = threading.Lock()
        self.gap = MIN_GAP_S
        # Allocations made here, not by the script (tracemalloc.Filter costs a pattern
        # match per trace; checking each distinct stack's innermost file is far cheaper).
        self.ours = {tracemalloc.__file__, helper, linecache.__file__}

    def on_marker(self, step: int | None, seen: int) -> None:
        """The `seen`-th step marker is out: snapshot it (the first, and the one the run
        stops at, whatever the gap)."""
        self.take(step, force=seen in (1, self.limits.markers), marker=seen)

    def take(self, step: int | None, force: bool = False, marker: int | None = None) -> None:
        """A snapshot now (unless the last was too recent); `marker`: the markers seen."""
        marker = self.limits.seen if marker is None else marker
        with self.lock:
            now = time.monotonic() - self.t0
            if not force and now - self.last < self.gap:
                return
            self.last = now
            cpu = time.thread_time()
            sizes = {
                tuple((f.filename, f.lineno) for f in stat.traceback): stat.size
                for stat in tracemalloc.take_snapshot().statistics("traceback")
                if stat.size >= MIN_STACK_BYTES and stat.traceback[-1].filename not in self.ours
            }
            # Snapshots take at most a sixth of the run, however fast its steps are. Counted
            # in this thread's CPU time: on a loaded machine a snapshot descheduled midway
            # took 0.1 s of wall time, and five times that spaced the next snapshot past
            # the steps the comparison judges (engine/attribution.py rule 2).
            self.gap = max(MIN_GAP_S, 5 * (time.thread_time() - cpu))
            if marker and self.taken and not self.taken[-1][0]["marker"]:
                self.taken = []  # the first marker's: set-up is never judged
            self.taken.append(({"t": round(now, 3), "step": step, "marker": marker}, sizes))
            if len(self.taken) > 2 * MAX_SNAPSHOTS:  # keep the first, every other, the last
                keep = [0, *range(1, len(self.taken) - 1, 2), len(self.taken) - 1]
                self.taken = [self.taken[i] for i in keep]

    def timer(self, done: threading.Event) -> None:
        while not done.wait(INTERVAL_S):
            if not self.limits.seen:
                self.take(None)

    def profile(self, script: str) -> dict:
        taken = self.taken
        if any(t["marker"] for t, _ in taken):  # a timer's, racing the first marker's
            taken = [snapshot for snapshot in taken if snapshot[0]["marker"]]
        if len(taken) > MAX_SNAPSHOTS:
            taken = [taken[round(i * (len(taken) - 1) / (MAX_SNAPSHOTS - 1))]
                     for i in range(MAX_SNAPSHOTS)]  # fmt: skip
        sizes = [s for _, s in taken]
        keys = set().union(*sizes) if sizes else set()
        first = sizes[0] if sizes else {}
        last = sizes[-1] if sizes else {}
        grown = sorted(keys, key=lambda k: last.get(k, 0) - first.get(k, 0), reverse=True)
        stacks = [
            {
                "frames": from_script(
                    [[relative(f), n, function_at(f, n)] for f, n in key], script
                ),
                "sizes": [s.get(key, 0) for s in sizes],
            }
            for key in grown[:MAX_STACKS]
        ]
        return {"snapshots": [t for t, _ in taken], "stacks": stacks}


class MarkerStdout(io.TextIOBase):
    """stdout as the script sees it: every line passes through; a step marker line is
    counted in `limits` once it is out (flushed: the marker means "this step starts now"),
    then `on_marker` (a snapshot) sees it, then the run may stop there."""

    def __init__(
        self,
        out: io.TextIOBase,
        limits: Limits,
        on_marker: Callable[[int | None, int], None] | None = None,
    ) -> None:
        self.out = out
        self.limits = limits
        self.on_marker = on_marker
        self.pending = ""

    def write(self, text: str) -> int:
        steps: list[tuple[int | None, int]] = []  # (its number, markers seen)
        with self.limits.held():
            self.out.write(text)
            self.pending += text
            while "\n" in self.pending:
                line, self.pending = self.pending.split("\n", 1)
                if line.startswith(STEP_MARKER):
                    self.out.flush()
                    self.limits.seen += 1
                    rest = line[len(STEP_MARKER) :].split()
                    number = int(rest[0]) if rest and rest[0].lstrip("-").isdigit() else None
                    steps.append((number, self.limits.seen))
            if len(self.pending) > 4096:
                self.pending = self.pending[-len(STEP_MARKER) :]
        for number, seen in steps:
            if self.on_marker is not None:
                self.on_marker(number, seen)
            self.limits.reached()
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.out.encoding


def run(script: str, limits: Limits) -> int:
    """The script as `python SCRIPT` would run it, until it ends or `limits` stop it; its
    exit status (0 when stopped, 1 with the traceback printed when it raised)."""
    sys.argv = [script]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    limits.arm()
    try:
        runpy.run_path(script, run_name="__main__")
        limits.ended()
    except Stop:
        return 0
    except SystemExit as exc:
        limits.ended()
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # noqa: BLE001 - the script's own error: reported, profile kept
        limits.ended()
        traceback.print_exc()
        return 1
    return 0


def with_tracemalloc(script: str, out: str, limits: Limits) -> tuple[int, dict]:
    tracemalloc.start(NFRAMES)
    snapshots = Snapshots(os.path.abspath(__file__), limits)
    real = sys.stdout
    sys.stdout = MarkerStdout(real, limits, snapshots.on_marker)  # type: ignore[assignment]
    done = threading.Event()
    threading.Thread(target=snapshots.timer, args=(done,), daemon=True).start()
    try:
        code = run(script, limits)
    finally:
        limits.disarm()
        done.set()
        sys.stdout = real
        if (limits.stopped or {}).get("by") != "markers":  # else its marker's snapshot is last
            snapshots.take(None, force=True)
        tracemalloc.stop()
    return code, snapshots.profile(script)


def with_memray(script: str, out: str, limits: Limits) -> tuple[int, dict]:
    try:
        import memray  # the runner added it to this environment
    except ImportError as exc:
        return run(script, limits), {"error": f"memray did not import: {exc}"}
    capture = out + ".bin"
    # Aggregated: per-stack counts instead of every allocation, so a long run's capture
    # file stays small; it keeps what the leak report reads (memray >= 1.8).
    aggregated = getattr(getattr(memray, "FileFormat", None), "AGGREGATED_ALLOCATIONS", None)
    options = {"file_format": aggregated} if aggregated is not None else {}
    real = sys.stdout
    sys.stdout = MarkerStdout(real, limits)  # type: ignore[assignment]
    try:
        with memray.Tracker(capture, native_traces=True, follow_fork=False, **options):
            code = run(script, limits)
        sys.stdout = real
        took = time.monotonic() - limits.t0
        reader = memray.FileReader(capture)
        records = sorted(reader.get_leaked_allocation_records(merge_threads=True),
                         key=lambda r: r.size, reverse=True)[:MAX_STACKS]  # fmt: skip
        stacks = [
            {
                "frames": _memray_frames(r.hybrid_stack_trace(), script),
                "sizes": [r.size],
            }
            for r in records
            if r.size >= MIN_STACK_BYTES
        ]
    finally:
        sys.stdout = real
        if os.path.exists(capture):
            os.unlink(capture)
    snapshot = {"t": round(took, 3), "step": None, "marker": limits.seen}
    return code, {"snapshots": [snapshot], "stacks": stacks}


def _memray_frames(trace: list[tuple[str, str, int]], script: str) -> list[list]:
    """Outermost first, from the script's frame in, at most `MEMRAY_FRAMES` of the
    innermost; frames memray could not name at all (stripped libraries) left out. The
    whole stack is read: a C extension's own frames and the interpreter's under the
    package's line (msgpack's unpackb: 12 of them) would push that line out of a short one."""
    named = [(fn, f, n) for fn, f, n in trace if (fn, f) != ("<unknown>", "<unknown>")]
    frames = from_script([[relative(f), n, fn] for fn, f, n in reversed(named)], script)
    return frames[-MEMRAY_FRAMES:]


def write(out: str, profile: dict) -> None:
    """The profile whole at `out`, or nothing there: written aside, then renamed."""
    aside = out + ".tmp"
    with open(aside, "w") as f:
        json.dump(profile, f)
    os.replace(aside, out)


def parse(argv: list[str]) -> tuple[str, str, str, Limits] | None:
    """(tracer, out, script, limits) from the command line; None when it is not one."""
    if len(argv) not in (3, 5) or argv[0] not in ("tracemalloc", "memray"):
        return None
    try:
        limits = Limits(int(argv[3]), float(argv[4])) if len(argv) == 5 else Limits()
    except ValueError:
        return None
    return argv[0], argv[1], argv[2], limits


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        print(__doc__, file=sys.stderr)
        return 2
    tracer, out, script, limits = parsed
    trace = with_tracemalloc if tracer == "tracemalloc" else with_memray
    code, profile = trace(script, out, limits)
    write(out, {"tracer": tracer, "error": None, **limits.record(), **profile})
    if limits.stopped is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
