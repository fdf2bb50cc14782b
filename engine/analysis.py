"""The leak classifier: memory samples in, a verdict with its numbers out.

Pure: no I/O, no clock, no globals, so the local mode, the service and the
tests all drive exactly the same decisions.

Why not a trend test on the raw samples: memory samples are strongly
autocorrelated, so OLS or Mann-Kendall p-values call about half of all flat
runs a trend. What separates a leak from everything else is the *floor* of
the curve: a leak raises it, a checkpoint spike or a GC sawtooth only moves
the ceiling. So, per series (host and GPU separately):

1. Keep the judged part (contract/floors.py `judged_part`, the one definition
   the early-stop rule shares): when the script prints step markers, never what
   comes before the first marker (set-up: imports, model and data loading) nor,
   of a script that exited by itself, anything after the last (its last step and
   its teardown); then drop the first
   `max(warmup_steps, ceil(warmup_step_fraction * steps))` steps and judge per
   step, or, with fewer judged steps than `min_blocks`, per second from the first
   marker on. Without markers, per second after `warmup_fraction` of the run.
2. Leave out the samples that lie inside an excursion (contract/floors.py
   `excursions`: at least T above the level the series holds both before and after
   them: a spike, a buffer touched for seconds on a loaded machine, a sawtooth's
   ramp), so no floor is the inside of one. Split the rest into
   `clamp(n // block_samples, min_blocks, max_blocks)` blocks of equal width
   (seconds, or steps when markers exist) and take each block's `floor_percentile`:
   its floor. Where fewer than `min_blocks` blocks have `min_block_samples` samples
   (the sampler stalled on a loaded machine), cut finer, one block more at a time
   while the samples allow, until `min_blocks` are usable; failing that (the samples
   bunch up: a loaded runner read a stretch of a fast loop late), cut them into
   blocks of an equal share of the samples instead of an equal width.
   What a verdict needs is counted in steps when there are markers: `min_blocks`
   blocks of `min_block_samples` readings, and the sampler reads every step at its
   marker (runners/watch.py), so a run of `enough_markers()` markers (21 at the
   defaults: 2 warm-up steps, 18 judged, the last step its teardown) is judged,
   however fast its steps (down to 1 ms), unless excursions take its readings. A run
   with fewer is INCONCLUSIVE
   "too few readings to judge alone" and keeps its floors (each judged step's lowest
   reading) for engine/pooled.py, which judges such runs of one candidate together;
   the scheduler runs it again, asking for a longer run.
3. Fit a Theil-Sen slope to the floors with its `confidence` interval.
   growth = slope x window, the window being the judged span in seconds or the
   number of judged steps. The threshold is
   T = max(min_growth_mib, min_growth_fraction x baseline), the baseline being
   the first floor, so a leak must beat both the absolute and the relative one.
4. Describe the shape: the late and early slopes (Theil-Sen over the last and
   the first `late_fraction` of the floors, the late one with its interval);
   the rise (median late floor minus the baseline) and the rise rate (the
   steady rate that would have produced that rise); the step ratio (how much
   better a single jump fits the floors than a line does); the largest drop of
   the floor below its running maximum.

Verdicts, checked in this order:

- LEAK: slope_low > 0, growth >= T, the late slope is at least
  `leak_late_ratio` x max(slope, rise rate) and at least `saturation_ratio` x
  the early slope (still rising at the end, at the pace that produced the
  rise, not slowing down to a stop), the step ratio is above `max_step_ratio`
  (the rise is spread over the run, not one jump), and the floor never fell
  back by `max_drop_ratio` x T or more (a leak does not give memory back).
- PLATEAU: the rise is >= T and even the upper bound of the late slope is at
  most `plateau_late_ratio` x the rise rate: it grew, then stopped.
- INCONCLUSIVE: the rise is >= T but it is neither a leak nor a plateau.
- INCONCLUSIVE: the floor of the last two blocks is T or more above the
  baseline (a jump at the very end, such as a first checkpoint, could start a
  leak).
- CLEAN: even slope_high x window is below T.
- INCONCLUSIVE otherwise: too noisy for the run's length; run longer or again.

Consequences (pinned by tests/test_analysis.py; rates measured on
engine.synthetic traces with its default 3 MiB AR(1) noise, 2 s correlation):

- A one-off step up (`late_step`) followed by at least the last third of the
  judged window flat is PLATEAU: the floor rose once and stayed. A step closer
  to the end is INCONCLUSIVE (nothing says it stopped), never LEAK nor CLEAN.
- A cache that fills then stops is PLATEAU once its flat tail covers the last
  third of the judged window; a cache whose fill is smaller than T is CLEAN or
  INCONCLUSIVE, never LEAK.
- Run length. Without step markers the late slope of a 60 s run is uncertain
  by about +-13 MiB over the window, so leaks near the threshold and small
  plateaus come out INCONCLUSIVE more often there; from about 2 minutes the
  scenarios in engine.synthetic are called correctly in >= 96 % of seeds.
- Minimum run length for a slow leak: a leak of r x baseline per minute needs
  a judged window of min_growth_fraction / r minutes just to reach T. For the
  slow leak of the brief (0.5 %/min) that is 10 minutes judged, 12.5 minutes of
  run with the 20 % warm-up; at 12.5 minutes about half the seeds are LEAK (the
  rest INCONCLUSIVE or CLEAN), from 15 minutes >= 99 % are. Tests use 20.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from contract.floors import (
    block_floors,
    count_floors,
    excursions,
    judged_part,
    largest_drop,
    step_index,
    step_ratio,
    threshold_mib,
)
from contract.theilsen import theilslopes
from engine.verdicts import Verdict

MIB = 1024 * 1024
SKIP_EXIT_CODE = 125
# The most floors a run too short to judge alone keeps for pooling (`_short`).
SHORT_POINTS = 60  # git bisect's "cannot test this revision"


@dataclass(frozen=True)
class ClassifierSettings:
    """Thresholds of the classifier; a job's policy may override any of them.

    Fields (default, meaning):

    - warmup_fraction (0.2): share of the run dropped at its start when the script
      prints no step markers (imports, first allocations, allocator warm-up); with
      markers but too few judged steps, share of the part from the first marker on.
    - warmup_steps (2) and warmup_step_fraction (0.05): with step markers, samples
      before the first marker are dropped (set-up), and then the first
      max(warmup_steps, ceil(warmup_step_fraction x steps)) steps. Markers say where
      the work starts, so less needs dropping than without them; the first steps
      still allocate optimizer state, CUDA context and autotuner workspaces.
    - min_blocks (6), max_blocks (30): bounds on the number of blocks.
    - block_samples (20): target samples per block; blocks = clamp(n // block_samples,
      min_blocks, max_blocks). 20 samples (2 s at 10 Hz) keeps a block's floor below
      a checkpoint spike of up to ~1.8 s.
    - min_block_samples (3): a block with fewer samples has no meaningful floor and
      is dropped; fewer than min_blocks usable blocks means INCONCLUSIVE.
    - floor_percentile (10.0): the percentile of a block taken as its floor. Low
      enough to ignore spikes covering up to 90 % of a block, high enough not to
      chase single low outliers.
    - min_growth_mib (8.0): absolute threshold, MiB over the judged window.
    - min_growth_fraction (0.05): relative threshold, share of the baseline floor over
      the judged window (25 MiB on a 500 MiB process, 200 MiB on a 4 GiB one).
      The threshold T is the larger of the two.
    - confidence (0.95): confidence level of the Theil-Sen slope interval.
    - late_fraction (1/3), late_min_blocks (3): the late slope is fitted to the last
      late_fraction of the blocks, at least late_min_blocks of them. A third: long
      enough to measure a rate, short enough to lie after a cache has filled.
    - leak_late_ratio (0.5): LEAK needs the late slope to be at least this share of
      max(slope, rise rate): a leak keeps growing at its pace to the end.
    - plateau_late_ratio (0.5): PLATEAU needs even the upper bound of the late slope
      to be at most this share of the rise rate: growth clearly slowed down.
    - saturation_ratio (0.35): LEAK also needs the late slope to be at least this share
      of the early slope (Theil-Sen over the first late_fraction of the floors). A
      curve that has slowed to a third of its early pace is saturating, whatever
      noise does to its late slope; a leak's early and late slopes agree.
    - max_step_ratio (0.35): LEAK needs the step ratio (absolute deviations of the
      floors from the best single jump, over those from the Theil-Sen line) above
      this. One-off allocations measure below 0.25 even at twice the default
      noise; steady leaks above 0.8.
    - max_drop_ratio (1.0): LEAK needs the floor never to fall by this x T or more
      below its running maximum (floors over three blocks at a time). A leak does not
      give memory back; a GC sawtooth slower than the blocks does, and its ramps
      would otherwise read as growth.
    - crash_leak_is_leak (True): a run that exits non-zero (not 125, not killed by
      the cap) but whose samples meet the full LEAK criteria is a LEAK rather than
      an ERROR: a CUDA out-of-memory error is an exception and exit 1, and it is
      exactly what a GPU leak ends in. Set False to treat every crash as ERROR.
    """

    warmup_fraction: float = 0.2
    warmup_steps: int = 2
    warmup_step_fraction: float = 0.05
    min_blocks: int = 6
    max_blocks: int = 30
    block_samples: int = 20
    min_block_samples: int = 3
    floor_percentile: float = 10.0
    min_growth_mib: float = 8.0
    min_growth_fraction: float = 0.05
    confidence: float = 0.95
    late_fraction: float = 1 / 3
    late_min_blocks: int = 3
    leak_late_ratio: float = 0.5
    plateau_late_ratio: float = 0.5
    saturation_ratio: float = 0.35
    max_step_ratio: float = 0.35
    max_drop_ratio: float = 1.0
    crash_leak_is_leak: bool = True

    def __post_init__(self) -> None:
        # Settings come from job policies; reject nonsense early rather than
        # produce verdicts nobody can explain.
        checks = {
            "warmup_fraction": 0.0 <= self.warmup_fraction < 1.0,
            "warmup_steps": self.warmup_steps >= 0,
            "warmup_step_fraction": 0.0 <= self.warmup_step_fraction < 1.0,
            "min_blocks": self.min_blocks >= 3,
            "max_blocks": self.max_blocks >= self.min_blocks,
            "block_samples": self.block_samples >= 1,
            "min_block_samples": self.min_block_samples >= 1,
            "floor_percentile": 0.0 <= self.floor_percentile <= 100.0,
            "min_growth_mib": self.min_growth_mib >= 0.0,
            "min_growth_fraction": self.min_growth_fraction >= 0.0,
            "confidence": 0.5 < self.confidence < 1.0,
            "late_fraction": 0.0 < self.late_fraction <= 1.0,
            "late_min_blocks": 2 <= self.late_min_blocks <= self.min_blocks,
            "leak_late_ratio": 0.0 < self.leak_late_ratio <= 1.0,
            "plateau_late_ratio": 0.0 < self.plateau_late_ratio <= 1.0,
            "saturation_ratio": 0.0 <= self.saturation_ratio <= 1.0,
            "max_step_ratio": self.max_step_ratio >= 0.0,
            "max_drop_ratio": self.max_drop_ratio > 0.0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid classifier settings: {', '.join(bad)}")


@dataclass(frozen=True)
class SeriesAnalysis:
    """The verdict on one memory series (host or GPU) and the numbers behind it.

    Slopes are in `unit` ("MiB/s", or "MiB/step" when step markers were used)
    and all memory in MiB. `window` is the judged span in seconds or steps;
    `growth_mib` is slope x window; `threshold_mib` is the growth that counts
    (T); `baseline_mib` is the first judged floor; `rise_mib` is the median of
    the late floors minus the baseline, `end_rise_mib` the floor of the last two
    blocks together minus the baseline; `late_slope`/`late_slope_high` and
    `early_slope` are the Theil-Sen slopes of the last and first `late_fraction`
    of the floors; `step_ratio` compares the best single jump with the line
    (small: one jump); `drop_mib` is the deepest fall of the floor below its
    running maximum; `floors_mib` and `floor_x` are the floors and their
    positions (seconds or step numbers); `samples` counts the judged samples.
    Fields the verdict could not compute (too few samples) are None.
    """

    verdict: Verdict
    reason: str
    unit: str
    slope: float | None = None
    slope_low: float | None = None
    slope_high: float | None = None
    growth_mib: float | None = None
    baseline_mib: float | None = None
    peak_mib: float | None = None
    floors_mib: tuple[float, ...] = ()
    late_slope: float | None = None
    late_slope_high: float | None = None
    early_slope: float | None = None
    step_ratio: float | None = None
    drop_mib: float | None = None
    samples: int = 0
    window: float | None = None
    threshold_mib: float | None = None
    rise_mib: float | None = None
    end_rise_mib: float | None = None
    floor_x: tuple[float, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only: strings, lists, finite floats or None."""
        d = asdict(self)
        d["verdict"] = self.verdict.value
        for key, value in d.items():
            if isinstance(value, float) and not math.isfinite(value):
                d[key] = None  # JSON has no infinity; a step ratio can be one
        d["floors_mib"] = list(self.floors_mib)
        d["floor_x"] = list(self.floor_x)
        return d


@dataclass(frozen=True)
class RunAnalysis:
    """The verdict on one run: the series' verdicts combined with how the run ended."""

    verdict: Verdict
    reason: str
    host: SeriesAnalysis
    gpu: SeriesAnalysis | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "host": self.host.to_dict(),
            "gpu": None if self.gpu is None else self.gpu.to_dict(),
        }


# --------------------------------------------------------------------------- series


def _fmt(x: float) -> str:
    """Three significant figures: enough to paste into an issue, no false precision."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{digits}f}"


def _clean_series(
    t: Sequence[float], values: Sequence[float | None]
) -> tuple[np.ndarray, np.ndarray]:
    if len(t) != len(values):
        raise ValueError(f"{len(t)} times but {len(values)} values")
    tt = np.asarray(t, dtype=float)
    # numpy turns None into NaN for a float array, so unknown samples drop out below.
    vv = np.array(values, dtype=float)
    keep = np.isfinite(tt) & np.isfinite(vv)
    tt, vv = tt[keep], vv[keep] / MIB
    order = np.argsort(tt, kind="stable")
    return tt[order], vv[order]


def _floors(
    x: np.ndarray, v: np.ndarray, n_blocks: int, settings: ClassifierSettings, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal-width blocks over x: each usable block's position, floor and wide floor, from
    the samples outside excursions (contract/floors.py, shared with the early-stop rule)."""
    return block_floors(
        x, v, n_blocks, settings.min_block_samples, settings.floor_percentile, keep
    )


def _insufficient(reason: str, unit: str, n: int, peak: float | None) -> SeriesAnalysis:
    return SeriesAnalysis(
        verdict=Verdict.INCONCLUSIVE, reason=reason, unit=unit, samples=n, peak_mib=peak
    )


def _short(
    x: np.ndarray,
    v: np.ndarray,
    window: float,
    unit: str,
    n: int,
    peak: float | None,
    s: ClassifierSettings,
    reason: str,
) -> SeriesAnalysis:
    """INCONCLUSIVE for a run too short to judge alone, with the floors it has for pooling
    (engine/pooled.py, short runs): per step, each step's lowest reading; per second, the
    readings, at most SHORT_POINTS (the lowest of each of that many equal stretches)."""
    if unit == "MiB/step":
        fx = np.unique(x)
        floors = np.array([float(v[x == step].min()) for step in fx])
    else:
        fx, floors = x, v
        if len(fx) > SHORT_POINTS:
            fx, floors, _ = block_floors(x, v, SHORT_POINTS, 1, 0.0)
    baseline = float(floors[0]) if len(floors) else None
    return SeriesAnalysis(
        verdict=Verdict.INCONCLUSIVE,
        reason=reason,
        unit=unit,
        samples=n,
        peak_mib=peak,
        window=window if len(floors) else None,
        baseline_mib=baseline,
        threshold_mib=None if baseline is None else threshold_mib(s, baseline),
        floors_mib=tuple(float(f) for f in floors),
        floor_x=tuple(float(p) for p in fx),
    )


def _oom_rise(v: np.ndarray, settings: ClassifierSettings) -> tuple[float, float, float] | None:
    """(rise, baseline, threshold) from first vs last quarter floors, for short OOM runs.

    A process killed by the cap seconds after starting has too few samples for
    blocks, but being killed is itself evidence; a floor that rose past the
    threshold before the kill is enough.
    """
    n = len(v)
    q = n // 4
    if q < 2:
        return None
    first = float(np.percentile(v[:q], settings.floor_percentile))
    last = float(np.percentile(v[-q:], settings.floor_percentile))
    threshold = max(settings.min_growth_mib, settings.min_growth_fraction * first)
    return last - first, first, threshold


def enough_markers(s: ClassifierSettings = ClassifierSettings()) -> int:  # noqa: B008
    """Step markers that are always enough to judge a run with a reading at each (rule 2):
    the warm-up steps, `min_blocks` blocks of `min_block_samples` steps, and the last
    step (after the last marker of a run that exited: its teardown)."""
    return s.warmup_steps + s.min_blocks * s.min_block_samples + 1


def _too_few(t: np.ndarray, steps: Sequence[tuple[float, int]]) -> str:
    """Why a run has no judged part: too few samples, or none after the first marker."""
    if not steps or not len(t):
        return f"too few samples to judge: {len(t)}"
    _, inside, first, _ = step_index(t, steps)
    return (
        f"too few samples to judge: {int(inside.sum())} of {len(t)} from the first step "
        f"marker ({_fmt(first)} s) on; what comes before it is set-up"
    )


def classify_series(
    t: Sequence[float],
    values_bytes: Sequence[float | None],
    steps: Sequence[tuple[float, int]] = (),
    *,
    oom_killed: bool = False,
    ended: bool = False,
    settings: ClassifierSettings = ClassifierSettings(),  # noqa: B008 - frozen, safe to share
) -> SeriesAnalysis:
    """Judge one series of memory samples (bytes; None = unknown, dropped).

    With `steps` ((t, step) markers) growth is measured per step; with fewer
    judged steps than `min_blocks` it falls back to per second, from the first
    marker on (what comes before it is never judged). `oom_killed` says
    the run was killed by the memory cap: then a floor that rose by the threshold
    is a LEAK even when the run is too short or too irregular for the full test.
    `ended` says the script exited by itself: nothing after its last marker is judged
    (contract/floors.py rule 1).
    """
    tt, vv = _clean_series(t, values_bytes)
    peak = float(vv.max()) if len(vv) else None

    part = judged_part(tt, vv, steps, settings, ended=ended) if len(tt) else None
    if part is None:
        return _insufficient(_too_few(tt, steps), "MiB/s", len(tt), peak)
    x, v, window = part.x, part.v, part.window
    unit = f"MiB/{part.per}"
    n = len(v)

    if oom_killed:
        verdict = _classify_blocks(x, v, window, unit, n, peak, settings)
        if verdict.verdict is Verdict.LEAK:
            return verdict
        rise = _oom_rise(v, settings)
        if rise is not None and rise[0] >= rise[2]:
            return replace(
                verdict,
                verdict=Verdict.LEAK,
                reason=(
                    f"killed by the memory cap after the floor rose {_fmt(rise[0])} MiB "
                    f"(threshold {_fmt(rise[2])} MiB) between the first and last quarter "
                    f"of {n} samples"
                ),
                baseline_mib=rise[1],
                threshold_mib=rise[2],
                rise_mib=rise[0],
            )
        return verdict
    judged = _classify_blocks(x, v, window, unit, n, peak, settings)
    if steps and part.per == "s" and judged.slope is None:
        # Too short by seconds too: keep the floors per step, so runs of a candidate too
        # short to judge alone pool by steps (engine/pooled.py), as their markers count.
        stepped = judged_part(tt, vv, steps, settings, ended=ended, any_steps=True)
        if stepped is not None and stepped.per == "step":
            return _classify_blocks(stepped.x, stepped.v, stepped.window, "MiB/step",
                                    len(stepped.v), peak, settings)  # fmt: skip
    return judged


def _classify_blocks(
    x: np.ndarray,
    v: np.ndarray,
    window: float,
    unit: str,
    n: int,
    peak: float | None,
    s: ClassifierSettings,
) -> SeriesAnalysis:
    """Block floors of the judged samples, their fit (`_fit_floors`), then the rules (`_judge`)."""
    per = "step" if unit == "MiB/step" else "s"
    keep = ~excursions(x, v, s)
    usable = int(keep.sum())
    max_possible = min(usable // s.min_block_samples, s.max_blocks)
    if per == "step":
        # Markers may come every k steps; only distinct step values can form blocks.
        max_possible = min(max_possible, len(np.unique(x[keep])))
    if max_possible < s.min_blocks or window <= 0:
        need = s.min_blocks * s.min_block_samples
        if per == "step":
            why = (
                f"too few readings to judge alone: {usable} over {window:.0f} judged steps, "
                f"need at least {need} ({s.min_block_samples} in each of {s.min_blocks} blocks)"
            )
        else:
            why = f"too few samples to judge alone: {usable} after warm-up, need at least {need}"
        if usable < n:
            why += f"; {n - usable} more lie in excursions (spikes that came back down)"
        return _short(x[keep], v[keep], window, unit, n, peak, s, why)
    n_blocks = min(max(usable // s.block_samples, s.min_blocks), max_possible)
    fx, floors, wide = _floors(x, v, n_blocks, s, keep)
    # A sampler stalled on a loaded machine leaves a stretch without samples: cut finer,
    # one block more at a time, until min_blocks blocks are usable or the samples run out.
    finer = n_blocks
    while len(floors) < s.min_blocks and finer < max_possible:
        finer += 1
        cut = _floors(x, v, finer, s, keep)
        if len(cut[1]) >= s.min_blocks:
            fx, floors, wide = cut
    if len(floors) < s.min_blocks:
        # The samples bunch up (a loaded runner read a stretch of a fast loop late, or the
        # sampler stalled for long): blocks of an equal share of them instead, whole steps.
        cut = count_floors(x, v, n_blocks, s.floor_percentile, keep, whole=per == "step")
        if len(cut[1]) >= s.min_blocks:
            fx, floors, wide = cut
    if len(floors) < s.min_blocks:
        why = (
            f"too few usable blocks to judge alone: {len(floors)} of {n_blocks} have "
            f"{s.min_block_samples}+ samples"
        )
        return _short(x[keep], v[keep], window, unit, n, peak, s, why)
    numbers = _fit_floors(fx, floors, wide, window, s)
    verdict, reason = _judge(numbers, per, s)
    return SeriesAnalysis(
        verdict=verdict, reason=reason, unit=unit, peak_mib=peak, samples=n, **numbers
    )


def _fit_floors(
    fx: np.ndarray, floors: np.ndarray, wide: np.ndarray, window: float, s: ClassifierSettings
) -> dict[str, Any]:
    """The numbers the rules read, named as `SeriesAnalysis` fields."""
    slope, _, low, high = theilslopes(floors, fx, alpha=s.confidence)
    slope, low, high = float(slope), float(low), float(high)
    n_late = min(len(floors), max(s.late_min_blocks, math.ceil(s.late_fraction * len(floors))))
    late_fit = theilslopes(floors[-n_late:], fx[-n_late:], alpha=s.confidence)
    baseline = float(floors[0])
    rise = float(np.median(floors[-n_late:])) - baseline
    # The steady rate that would have produced the observed rise. A leak rises at
    # its slope all along, so for a leak rise_rate ~ slope ~ late slope; a cache
    # or a one-off step packs its rise into a short stretch, so rise_rate is far
    # above the late slope. Comparing against it (not only against the overall
    # Theil-Sen slope, which the median can put anywhere for a step) is what
    # keeps a large early plateau from passing as a leak.
    rise_span = float(np.median(fx[-n_late:]) - fx[0])
    return dict(
        step_ratio=step_ratio(fx, floors, slope),
        drop_mib=largest_drop(wide),
        slope=slope,
        slope_low=low,
        slope_high=high,
        growth_mib=slope * window,
        baseline_mib=baseline,
        floors_mib=tuple(float(f) for f in floors),
        late_slope=float(late_fit[0]),
        late_slope_high=float(late_fit[3]),
        early_slope=float(theilslopes(floors[:n_late], fx[:n_late], alpha=s.confidence)[0]),
        window=window,
        threshold_mib=threshold_mib(s, baseline),
        rise_mib=rise,
        # Where the floor ends up: a jump in the last blocks (a first checkpoint late in
        # the run) barely moves the late median or the slope, yet rules out CLEAN.
        end_rise_mib=float(wide[-1]) - baseline,  # the floor over the last two blocks
        floor_x=tuple(float(p) for p in fx),
        rise_rate=rise / rise_span if rise_span > 0 else 0.0,
    )


def _judge(m: dict[str, Any], per: str, s: ClassifierSettings) -> tuple[Verdict, str]:
    """The verdict rules over the fitted numbers, in order; the reason says which held."""
    o = _fmt
    slope, growth, late, rise, threshold = (
        m["slope"], m["growth_mib"], m["late_slope"], m["rise_mib"], m["threshold_mib"]
    )  # fmt: skip
    rise_rate = m.pop("rise_rate")
    window = m["window"]
    over = f"{window:.0f} steps" if per == "step" else f"{_fmt(window)} s"
    trend = (
        f"floor {'rises' if slope > 0 else 'slope'} {o(slope)} MiB/{per} "
        f"(CI {o(m['slope_low'])}..{o(m['slope_high'])}), "
        f"{'+' if growth >= 0 else ''}{o(growth)} MiB over {over}"
    )
    thr = f"threshold {o(threshold)} MiB"
    # Still rising at the pace that produced the rise, and not slowed to a fraction of
    # its early pace: a saturating curve (a cache) fails the second test even when
    # noise props up its late slope.
    reference = max(slope, rise_rate)
    still_rising = late >= s.leak_late_ratio * reference and late >= s.saturation_ratio * m[
        "early_slope"
    ]
    spread = m["step_ratio"] > s.max_step_ratio
    kept = m["drop_mib"] < s.max_drop_ratio * threshold

    if m["slope_low"] > 0 and growth >= threshold and still_rising and spread and kept:
        return Verdict.LEAK, f"{trend} ({thr}), still rising at the end ({o(late)} MiB/{per})"
    if rise >= threshold and m["late_slope_high"] <= s.plateau_late_ratio * rise_rate:
        return Verdict.PLATEAU, (
            f"floor rose {o(rise)} MiB ({thr}), then stopped: late slope {o(late)} "
            f"MiB/{per}, at most {o(m['late_slope_high'])}"
        )
    if rise >= threshold:
        if not spread:
            why = "in one jump, too close to the end to tell whether it stays"
        elif not kept:
            why = f"but fell back {o(m['drop_mib'])} MiB on the way (a slow sawtooth?)"
        elif still_rising:
            why = "but too unevenly or too uncertainly to call a leak"
        else:
            why = "and slowed down, but not clearly to a stop"
        return Verdict.INCONCLUSIVE, f"floor rose {o(rise)} MiB ({thr}) {why}; {trend}"
    if m["end_rise_mib"] >= threshold:
        return Verdict.INCONCLUSIVE, (
            f"floor jumped {o(m['end_rise_mib'])} MiB at the very end ({thr}), too late to "
            f"tell a one-off from the start of a leak; {trend}"
        )
    if m["slope_high"] * window < threshold:
        return Verdict.CLEAN, f"{trend}; even the upper bound stays under the {thr}"
    return Verdict.INCONCLUSIVE, (
        f"{trend}; too uncertain to call against the {thr}: run longer or again"
    )


# ------------------------------------------------------------------------------ run


def _combine(host: SeriesAnalysis, gpu: SeriesAnalysis | None) -> tuple[Verdict, str]:
    """Leak if either leaks; else inconclusive, plateau, clean in that order."""
    series = [("host", host)] + ([("gpu", gpu)] if gpu is not None else [])
    for wanted in (Verdict.LEAK, Verdict.INCONCLUSIVE, Verdict.PLATEAU, Verdict.CLEAN):
        deciding = [(name, a) for name, a in series if a.verdict is wanted]
        if deciding:
            # The series that decided comes first: that is the one to paste upstream.
            others = [(name, a) for name, a in series if a.verdict is not wanted]
            parts = [f"{name} {a.verdict.value}: {a.reason}" for name, a in deciding + others]
            return wanted, "; ".join(parts)
    raise AssertionError(f"unexpected series verdicts {[a.verdict for _, a in series]}")


def classify_run(
    t: Sequence[float],
    host_bytes: Sequence[float | None],
    gpu_bytes: Sequence[float | None] | None,
    steps: Sequence[tuple[float, int]] = (),
    *,
    exit_code: int | None,
    oom_killed: bool,
    timed_out: bool,
    settings: ClassifierSettings = ClassifierSettings(),  # noqa: B008 - frozen, safe to share
) -> RunAnalysis:
    """Judge one run from its samples and how it ended.

    - oom_killed (the memory cap killed it): LEAK when the host floor rose (the
      relaxed rule of `classify_series`) or the GPU series leaks; otherwise ERROR
      "killed by the memory cap without a rising floor". The cap limits host
      memory only, so only the host series gets the relaxed rule.
    - timed_out: LEAK when the samples leak, else ERROR "timed out after N s".
    - exit 125: SKIP (the script says this candidate cannot be tested).
    - any other non-zero exit, or no exit status: ERROR "crash, exit N"; but LEAK
      when the samples meet the full LEAK criteria and
      `settings.crash_leak_is_leak` (a CUDA OOM is an exception, exit 1).
    - exit 0: LEAK if either series leaks; else INCONCLUSIVE if either is; else
      PLATEAU if either plateaus; else CLEAN.

    `gpu_bytes` None, or all None, means the GPU series is unavailable and
    `gpu` is None: a machine without a GPU must not make every run inconclusive.
    """
    # Exited by itself (not killed by a signal, the cap or the deadline): it tore down.
    ended = exit_code is not None and exit_code >= 0 and not oom_killed and not timed_out
    host = classify_series(
        t, host_bytes, steps, oom_killed=oom_killed, ended=ended, settings=settings
    )
    gpu = None
    if gpu_bytes is not None and np.isfinite(np.array(gpu_bytes, dtype=float)).any():
        gpu = classify_series(t, gpu_bytes, steps, ended=ended, settings=settings)
    leaking = [(name, a) for name, a in (("host", host), ("gpu", gpu)) if a and a.verdict.leaks]
    tt = np.asarray(t, dtype=float)
    duration = float(np.nanmax(tt) - np.nanmin(tt)) if len(tt) else 0.0

    if oom_killed:
        if leaking:
            name, a = leaking[0]
            reason = (
                a.reason
                if a.reason.startswith("killed by the memory cap")
                else (f"killed by the memory cap; {name}: {a.reason}")
            )
            return RunAnalysis(Verdict.LEAK, reason, host, gpu)
        return RunAnalysis(
            Verdict.ERROR,
            f"killed by the memory cap without a rising floor (host: {host.reason})",
            host,
            gpu,
        )
    if timed_out:
        if leaking:
            name, a = leaking[0]
            return RunAnalysis(
                Verdict.LEAK, f"timed out after {_fmt(duration)} s; {name}: {a.reason}", host, gpu
            )
        return RunAnalysis(
            Verdict.ERROR,
            f"timed out after {_fmt(duration)} s (host {host.verdict.value}: {host.reason})",
            host,
            gpu,
        )
    if exit_code == SKIP_EXIT_CODE:
        return RunAnalysis(Verdict.SKIP, "skipped: the script exited 125", host, gpu)
    if exit_code != 0:
        status = "no exit status" if exit_code is None else f"exit {exit_code}"
        if leaking and settings.crash_leak_is_leak:
            name, a = leaking[0]
            return RunAnalysis(
                Verdict.LEAK,
                f"crashed ({status}) while leaking, likely out of memory; {name}: {a.reason}",
                host,
                gpu,
            )
        return RunAnalysis(Verdict.ERROR, f"crash, {status}", host, gpu)
    verdict, reason = _combine(host, gpu)
    return RunAnalysis(verdict, reason, host, gpu)


# ------------------------------------------------------------------------ candidate

def aggregate(verdicts: Sequence[Verdict]) -> Verdict:
    """A candidate's verdict from its runs' verdicts.

    The rule, in order:

    1. No runs: INCONCLUSIVE.
    2. Decisive runs are LEAK, CLEAN and PLATEAU; INCONCLUSIVE, SKIP and ERROR runs
       are ignored whenever there is at least one decisive run. Among the decisive
       runs, LEAK wins with a strict majority (more LEAK than CLEAN+PLATEAU); "not
       leaking" wins with a strict majority the other way and is reported as
       PLATEAU if PLATEAU runs are at least as many as CLEAN runs (a plateau says
       memory rose at some point, the more cautious summary), else CLEAN. A tie
       between LEAK and not-leaking is INCONCLUSIVE.
    3. No decisive runs: INCONCLUSIVE if any run was inconclusive (more runs may
       decide); else SKIP if any run exited 125 (the script itself declared the
       candidate untestable; errors alongside do not make it testable); else ERROR
       (every run crashed or failed).
    """
    vs = [Verdict(v) for v in verdicts]
    if not vs:
        return Verdict.INCONCLUSIVE
    leak = vs.count(Verdict.LEAK)
    clean = vs.count(Verdict.CLEAN)
    plateau = vs.count(Verdict.PLATEAU)
    if leak + clean + plateau:
        if leak > clean + plateau:
            return Verdict.LEAK
        if clean + plateau > leak:
            return Verdict.PLATEAU if plateau >= clean else Verdict.CLEAN
        return Verdict.INCONCLUSIVE
    if Verdict.INCONCLUSIVE in vs:
        return Verdict.INCONCLUSIVE
    if Verdict.SKIP in vs:
        return Verdict.SKIP
    return Verdict.ERROR


def needs_more_runs(verdicts: Sequence[Verdict], repeats: int, max_runs: int) -> bool:
    """True while fewer than `repeats` runs exist, or the aggregate is INCONCLUSIVE
    and fewer than `max_runs` runs exist."""
    n = len(verdicts)
    if n < repeats:
        return True
    return aggregate(verdicts) is Verdict.INCONCLUSIVE and n < max_runs
