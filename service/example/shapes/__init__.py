"""Real repro scripts of the memory shapes real packages have, each with its ground truth.

Every script here is a real Python program of a few seconds that imports numpy and scipy
(the framework import of a real repro: tens of MiB over a second), prints the step marker
`::leakbisect-step::` (flushed) at the start of each of its 40 steps, and needs nothing
but numpy and scipy (`Shape.packages`). Each is self-contained, so it runs as a job's
repro in a bisection's uv environment too. `SHAPES` lists them: a bounded shape's memory
stops growing however it wiggles, a leak shape's grows for as long as the script runs.

`run_shape(shape, work)` runs one the way a runner does (`runners.executor.run_script`:
a child process under the sampler and a memory cap), judges it with the classifier
(`engine.analysis.classify_run`, default settings) and replays early stopping over the
trace (`contract.earlystop.first_stop`) with the settings the service would send a later
trial of a job whose first full run was this one (`service.specs.early_stop`), and once
more with the short-horizon bound lifted, to see what the leak rule itself would do.
tests/test_shapes.py pins the verdicts; bench/neighbours.py measures them on a loaded
machine.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from contract.earlystop import EarlyStopper, first_stop, replay
from contract.wire import EarlyStop
from engine.analysis import classify_run
from runners.executor import run_script
from service.models import Trial, TrialKind, TrialStatus
from service.specs import early_stop

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
# Well above any shape (the largest holds about 450 MiB), well below the machine.
MEMORY_LIMIT = 2 * 1024 * MIB
# Each script's pause between steps (one per script, after its step's work).
PAUSE = "time.sleep(0.05)"


@dataclass(frozen=True)
class Shape:
    """One script: its file stem, its ground truth and what it does (its docstring says more)."""

    name: str
    truth: str  # "bounded" or "leak"
    what: str
    packages: tuple[str, ...] = ("numpy", "scipy")

    @property
    def script(self) -> Path:
        return HERE / f"{self.name}.py"


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("import_ramp", "bounded", "numpy + scipy, then 300 MiB over 3 s, then flat"),
        Shape("late_thread_pool", "bounded", "a 4-worker thread pool from step 12"),
        Shape("jit_warmup", "bounded", "compile, re and lru caches filling over 12 steps"),
        Shape("gc_generational", "bounded", "cyclic garbage freed by full collections"),
        Shape("malloc_arenas", "bounded", "a glibc arena per thread, 8 threads by step 16"),
        Shape("mmap_page_cache", "bounded", "np.memmap of 96 MiB read once, then again"),
        Shape("allocator_late", "bounded", "60 MiB batches returned 2 steps late"),
        Shape("model_after_marker", "bounded", "180 MiB of weights loaded at steps 3-5"),
        Shape("leak_python_objects", "leak", "import ramp, then 1.7 MiB of dicts a step"),
        Shape("leak_native", "leak", "import ramp, then 1.5 MiB malloc'd, never freed, a step"),
        Shape("leak_numpy_buffers", "leak", "import ramp, then a 1.5 MiB array kept a step"),
    )
}


@dataclass(frozen=True)
class ShapeRun:
    """One run of a shape: the classifier's verdict and what early stopping would do."""

    shape: str
    verdict: str
    reason: str
    # (seconds, reason) of the look that would stop a later trial of the same job; None:
    # it runs to its end.
    early_stop: tuple[float, str] | None
    # The same with the short-horizon bound lifted (`EarlyStopper(min_horizon_s=0)`): what
    # the leak rule itself does on this shape, as if the run were long enough to stop. On a
    # run of seconds it is noisy (few samples a step), which is why the bound exists.
    rule_stop: tuple[float, str] | None
    exit_code: int | None
    duration_s: float
    first_marker_s: float | None
    steps: int
    samples: int
    peak_mib: float
    # How much memory the set-up took: the most before the first marker over the first sample.
    setup_mib: float
    # The run's stored analysis (`RunAnalysis.to_dict`), as a trial keeps it for pooling.
    analysis: dict[str, Any]


def settings_after(duration_s: float, steps: int | None) -> EarlyStop:
    """What the service sends a trial of a default job whose one full run took `duration_s`
    and printed `steps` markers (`service.specs.early_stop`, as for a real job)."""
    full = Trial(
        job_id=1, candidate_id=1, kind=TrialKind.RUN, status=TrialStatus.DONE, exit_code=0,
        timed_out=False, duration_s=duration_s,
        analysis={"stopped_early": None, "step_count": steps},
    )  # fmt: skip
    job = SimpleNamespace(early_stop=True, classifier={})
    es = early_stop(job, [full])  # type: ignore[arg-type]
    assert es is not None
    return es


def run_shape(
    shape: Shape, work: Path, python: str = sys.executable, pause: float | None = None
) -> ShapeRun:
    """Run `shape` as a runner would (as this process's user, in `work`) and judge it.

    `pause`: seconds between steps instead of the script's 0.05 (0: an unpaced loop, the
    way a user's first repro is written)."""
    work.mkdir(parents=True, exist_ok=True)
    script = shape.script
    if pause is not None:
        script = work / shape.script.name
        script.write_text(shape.script.read_text().replace(PAUSE, f"time.sleep({pause!r})"))
    ex = run_script(python, script, cwd=work, timeout_s=300,
                    memory_limit_bytes=MEMORY_LIMIT, run_as=None)  # fmt: skip
    t = [s.t for s in ex.samples]
    rss = [s.rss for s in ex.samples]
    run = classify_run(t, rss, None, ex.steps, exit_code=ex.exit_code,
                       oom_killed=ex.oom_killed, timed_out=ex.timed_out)  # fmt: skip
    marks = [s for _, s in ex.steps]
    count = max(marks) - min(marks) + 1 if marks else None  # as service/trials.py counts
    es = settings_after(ex.duration_s, count)
    stop = first_stop(t, rss, ex.steps, MEMORY_LIMIT, es)
    rule = replay(t, rss, ex.steps, MEMORY_LIMIT, EarlyStopper(es, min_horizon_s=0.0))
    return ShapeRun(
        shape=shape.name,
        verdict=run.verdict.value,
        reason=run.reason,
        early_stop=stop,
        rule_stop=None if rule.at is None or rule.reason is None else (rule.at, rule.reason),
        exit_code=ex.exit_code,
        duration_s=ex.duration_s,
        first_marker_s=ex.steps[0][0] if ex.steps else None,
        steps=len(ex.steps),
        samples=len(t),
        peak_mib=max(rss, default=0) / MIB,
        setup_mib=_setup_mib(t, rss, ex.steps),
        analysis=run.to_dict(),
    )


def _setup_mib(t: list[float], rss: list[int], steps: list[tuple[float, int]]) -> float:
    first = steps[0][0] if steps else float("inf")
    before = [v for at, v in zip(t, rss, strict=True) if at < first]
    return (max(before) - before[0]) / MIB if before else 0.0


def main(argv: list[str]) -> int:
    """`python -m service.example.shapes [NAME ...]`: run and judge each (default: all)."""
    import tempfile

    unknown = [n for n in argv if n not in SHAPES]
    if unknown:
        print(f"unknown shape {unknown[0]}; known: {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for name in argv or list(SHAPES):
            t0 = time.monotonic()
            r = run_shape(SHAPES[name], Path(tmp) / name)
            stop = (
                "runs to its end" if r.early_stop is None else f"stopped at {r.early_stop[0]:.1f} s"
            )
            print(f"{name:20} {SHAPES[name].truth:7} {r.verdict:12} {stop:18} "
                  f"{time.monotonic() - t0:4.1f} s  {r.reason[:80]}")  # fmt: skip
    return 0
