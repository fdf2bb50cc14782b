"""Run a repro script under an allocation tracer and write its per-stack profile as JSON.

    PYTHON tracehelper.py TRACER OUT SCRIPT

Runs in the trial's own interpreter, beside the script, so it imports nothing but the
standard library (and memray, which the runner added to the trial's environment for the
"memray" tracer). The profile it writes to OUT (`runners/attribution.py` reads it):

    {"tracer": ..., "snapshots": [{"t": s, "step": n | null}, ...],
     "stacks": [{"frames": [[file, line, function], ...], "sizes": [bytes, ...]}, ...],
     "error": null | "why no profile"}

``frames`` are outermost first, innermost (the allocating line) last; ``file`` is relative
to site-packages where it lies there (so the same line compares across environments);
``sizes[i]`` is the stack's live bytes at ``snapshots[i]``.

* ``tracemalloc``: Python allocations, snapshots at each step marker the script prints
  (no closer than `MIN_GAP_S` apart, nor than five times the last snapshot took, so
  snapshots never take more than a sixth of the run), every
  `INTERVAL_S` while it prints none, and once at the end; thinned to `MAX_SNAPSHOTS`.
* ``memray``: native stacks (``native_traces``) of everything allocated and still live
  at the end, captured in memray's aggregated format (per stack, not per allocation, so
  the capture stays small however long the run): one snapshot. Growth across steps shows
  as live bytes that the last good release does not have (the comparison subtracts it).
"""

from __future__ import annotations

import ast
import io
import json
import linecache
import os
import runpy
import sys
import threading
import time
import tracemalloc

STEP_MARKER = "::leakbisect-step::"
NFRAMES = 12
MIN_GAP_S = 0.2
INTERVAL_S = 1.0
MAX_SNAPSHOTS = 24
MIN_STACK_BYTES = 4096  # smaller stacks are not kept per snapshot
MAX_STACKS = 60  # in the profile: the ones that grew most from the first snapshot


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


class Snapshots:
    """tracemalloc snapshots at step markers (stdout is wrapped) or on a timer."""

    def __init__(self, helper: str) -> None:
        self.t0 = time.monotonic()
        self.times: list[dict] = []
        self.sizes: list[dict[tuple, int]] = []
        self.last = -MIN_GAP_S
        self.steps_seen = 0
        self.lock = threading.Lock()
        self.gap = MIN_GAP_S
        # Allocations made here, not by the script (tracemalloc.Filter costs a pattern
        # match per trace; checking each distinct stack's innermost file is far cheaper).
        self.ours = {tracemalloc.__file__, helper, linecache.__file__}

    def take(self, step: int | None, force: bool = False) -> None:
        with self.lock:
            now = time.monotonic() - self.t0
            if not force and now - self.last < self.gap:
                return
            self.last = now
            sizes = {
                tuple((f.filename, f.lineno) for f in stat.traceback): stat.size
                for stat in tracemalloc.take_snapshot().statistics("traceback")
                if stat.size >= MIN_STACK_BYTES and stat.traceback[-1].filename not in self.ours
            }
            # Snapshots take at most a sixth of the run, however fast its steps are.
            self.gap = max(MIN_GAP_S, 5 * (time.monotonic() - self.t0 - now))
            self.times.append({"t": round(now, 3), "step": step})
            self.sizes.append(sizes)
            if len(self.sizes) > 2 * MAX_SNAPSHOTS:  # keep the first, every other, the last
                keep = [0, *range(1, len(self.sizes) - 1, 2), len(self.sizes) - 1]
                self.times = [self.times[i] for i in keep]
                self.sizes = [self.sizes[i] for i in keep]

    def timer(self, done: threading.Event) -> None:
        while not done.wait(INTERVAL_S):
            if not self.steps_seen:
                self.take(None)

    def profile(self, script: str) -> list[dict]:
        if len(self.sizes) > MAX_SNAPSHOTS:
            keep = [round(i * (len(self.sizes) - 1) / (MAX_SNAPSHOTS - 1)) for i in
                    range(MAX_SNAPSHOTS)]  # fmt: skip
            self.times = [self.times[i] for i in keep]
            self.sizes = [self.sizes[i] for i in keep]
        keys = set().union(*self.sizes) if self.sizes else set()
        first = self.sizes[0] if self.sizes else {}
        last = self.sizes[-1] if self.sizes else {}
        grown = sorted(keys, key=lambda k: last.get(k, 0) - first.get(k, 0), reverse=True)
        return [
            {
                "frames": from_script(
                    [[relative(f), n, function_at(f, n)] for f, n in key], script
                ),
                "sizes": [s.get(key, 0) for s in self.sizes],
            }
            for key in grown[:MAX_STACKS]
        ]


class MarkerStdout(io.TextIOBase):
    """stdout as the script sees it: every line passes through; a step marker line also
    takes a snapshot once it is out (the marker means "this step starts now")."""

    def __init__(self, out: io.TextIOBase, snapshots: Snapshots) -> None:
        self.out = out
        self.snapshots = snapshots
        self.pending = ""

    def write(self, text: str) -> int:
        self.out.write(text)
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            if line.startswith(STEP_MARKER):
                self.out.flush()
                rest = line[len(STEP_MARKER):].split()
                self.snapshots.steps_seen += 1
                step = int(rest[0]) if rest and rest[0].lstrip("-").isdigit() else None
                self.snapshots.take(step)
        if len(self.pending) > 4096:
            self.pending = self.pending[-len(STEP_MARKER):]
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.out.encoding


def run(script: str) -> int:
    """The script as `python SCRIPT` would run it; its exit status."""
    sys.argv = [script]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def with_tracemalloc(script: str, out: str) -> tuple[int, dict]:
    tracemalloc.start(NFRAMES)
    snapshots = Snapshots(os.path.abspath(__file__))
    real = sys.stdout
    sys.stdout = MarkerStdout(real, snapshots)  # type: ignore[assignment]
    done = threading.Event()
    threading.Thread(target=snapshots.timer, args=(done,), daemon=True).start()
    try:
        code = run(script)
    finally:
        done.set()
        sys.stdout = real
        snapshots.take(None, force=True)
        tracemalloc.stop()
    return code, {"snapshots": snapshots.times, "stacks": snapshots.profile(script)}


def with_memray(script: str, out: str) -> tuple[int, dict]:
    try:
        import memray  # the runner added it to this environment
    except ImportError as exc:
        return run(script), {"error": f"memray did not import: {exc}"}
    capture = out + ".bin"
    # Aggregated: per-stack counts instead of every allocation, so a long run's capture
    # file stays small; it keeps what the leak report reads (memray >= 1.8).
    aggregated = getattr(getattr(memray, "FileFormat", None), "AGGREGATED_ALLOCATIONS", None)
    options = {"file_format": aggregated} if aggregated is not None else {}
    t0 = time.monotonic()
    try:
        with memray.Tracker(capture, native_traces=True, follow_fork=False, **options):
            code = run(script)
        took = time.monotonic() - t0
        reader = memray.FileReader(capture)
        records = sorted(reader.get_leaked_allocation_records(merge_threads=True),
                         key=lambda r: r.size, reverse=True)[:MAX_STACKS]  # fmt: skip
        stacks = [
            {"frames": _memray_frames(r.hybrid_stack_trace(max_stacks=NFRAMES), script),
             "sizes": [r.size]}
            for r in records
            if r.size >= MIN_STACK_BYTES
        ]
    finally:
        if os.path.exists(capture):
            os.unlink(capture)
    return code, {"snapshots": [{"t": round(took, 3), "step": None}], "stacks": stacks}


def _memray_frames(trace: list[tuple[str, str, int]], script: str) -> list[list]:
    """Outermost first; frames memray could not name at all (stripped libraries) left out."""
    named = [(fn, f, n) for fn, f, n in trace if (fn, f) != ("<unknown>", "<unknown>")]
    return from_script([[relative(f), n, fn] for fn, f, n in reversed(named)], script)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("tracemalloc", "memray"):
        print(__doc__, file=sys.stderr)
        return 2
    tracer, out, script = argv
    trace = with_tracemalloc if tracer == "tracemalloc" else with_memray
    code, profile = trace(script, out)
    with open(out, "w") as f:
        json.dump({"tracer": tracer, "error": None, **profile}, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
