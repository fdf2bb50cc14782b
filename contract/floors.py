"""The judged part of a run and its block floors: the one definition the classifier
(engine/analysis.py) and the early-stop rule (contract/earlystop.py) share. Pure.

The judged part (`judged_part`), in this order:

1. Markers. Samples before the first step marker are set-up (imports, model and data
   loading) and those after the last marker are the last step and the teardown
   (evaluation, saving, freeing everything): neither is ever judged. Of a run that ended
   by itself (`ended`) no sample after its last marker is judged: the interpreter's exit
   frees memory within a step of it, and one such sample in a last block that a sampler
   stall thinned is that block's floor (a leak read as "slowed down"). Of a run still
   going or killed (the early-stop rule's looks, a timeout, the memory cap), samples up
   to two typical step durations after the last marker are its step in progress. Step numbers
   are taken as printed unless they ever decrease in time (a counter reset every epoch),
   then the markers are counted instead (`step_index`).
2. By steps. With markers, the first max(warmup_steps, ceil(warmup_step_fraction x steps))
   steps from the first marker are dropped too (optimizer state, CUDA context, autotuner
   workspaces), counted from the first marker printed, read or not (on a loaded machine a
   fast loop's first markers can reach the reader together, and only the last of them is
   read); when at least min_blocks judged steps remain, x is the step and the window is
   the number of judged steps.
3. By seconds, otherwise, unless `steps_only` (then None: the early-stop rule never judges
   a run of a job whose runs print markers by seconds). x is the time, over the samples
   rule 1 kept when the run has markers (from the first marker on), else over all of them
   but, of a run that ended by itself, its exit: the readings at its end that each fell
   below the one before, within a second of the last (the interpreter freeing what the
   run held: three readings of 158, 98, 69 and 14 MiB after a plateau of 158 were a last
   block's floor, and its plateau read as an excursion that came back down), with the
   first warmup_fraction of their span dropped; `full_span` makes that at least
   warmup_fraction x full_span (the early-stop rule passes its horizon: what the classifier
   would drop from a whole run, not a fraction of the part seen so far). Fewer than two
   samples left: None.

Excursions (`excursions`): a stretch of samples that stands at least the threshold T above
the level the series holds (two readings in a row) both before it and after it, each looked
for within a third of the judged span (two of the widest blocks): a checkpoint spike, a
buffer touched page by page, a GC sawtooth's ramp, however long it lasts and however the
machine's load stretches it. What a leak adds never comes back down, so a leak is never an
excursion; a cache that fills and stays is not one either. At the series' end a sample with
no level held after it is never in an excursion: a rise at the end is what a leak looks
like. At its start the level before lies before the judged part, so the opening stretch
whose levels held each stand T above a level held after them is one (a 32 MiB spike the
warm-up cut into read as three floors of 48 MiB over a leak's 19 to 33, and the leak as a
fall). A single low reading (a glitch) is no level. T here is the classifier's, from a
provisional baseline (the floor of the first sixth of the span). Excursion samples are left
out of every floor below, so a block's floor is never the inside of one long spike (the
floors of 11 blocks read 108, 122, 137, 168, 211, 317, 339, 339, 221, 154, 171 MiB when a
200 MB buffer was touched for over a second on a loaded machine: three floors were the
spike), and a block that lay wholly inside one has no floor (dropped like a block a stall
left empty).

Block floors (`block_floors`): the judged samples are cut into equal-width blocks over x
(seconds or steps); a block with fewer than `min_block_samples` samples (excursions left
out) is dropped; each kept block gives its position (median x), its floor (`percentile` of
its values) and its wide floor (the same percentile over the block and its two neighbours:
steadier, which is what the drop test needs).

`step_ratio` (the classifier's spread test, also the early-stop rule's) says how much
better one jump explains the floors than a straight line does; `largest_drop` (their drop
test) how far the wide floor ever fell below its running maximum; `steps_done` how many
steps the markers so far span.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np


class WarmUp(Protocol):
    warmup_fraction: float
    warmup_steps: int
    warmup_step_fraction: float
    min_blocks: int


class Threshold(Protocol):
    min_growth_mib: float
    min_growth_fraction: float
    floor_percentile: float
    min_blocks: int


def threshold_mib(s: Threshold, baseline: float) -> float:
    """T: the growth that counts, the larger of the absolute and the relative threshold."""
    return max(s.min_growth_mib, s.min_growth_fraction * max(baseline, 0.0))


class Judged(NamedTuple):
    """The judged samples: positions (steps or seconds), values, window, and the unit."""

    x: np.ndarray
    v: np.ndarray
    window: float
    per: str  # "step" | "s"


class Marked(NamedTuple):
    """Each sample's step (-1 before the first marker), which samples lie inside the marked
    loop, and the first marker's time and step."""

    step: np.ndarray
    inside: np.ndarray
    first_t: float
    first_step: int


def step_index(
    t: np.ndarray, steps: Sequence[tuple[float, int]], ended: bool = False
) -> Marked:
    """Rule 1 of the module docstring, per sample. `steps` must not be empty."""
    marks = sorted((float(mt), int(ms)) for mt, ms in steps)
    mt = np.array([m[0] for m in marks])
    ms = np.array([m[1] for m in marks])
    if np.any(np.diff(ms) < 0):
        # Step numbers that go back (a counter reset every epoch, several loops) say
        # nothing about how much work was done; count markers instead.
        ms = np.arange(len(ms))
    idx = np.searchsorted(mt, t, side="right") - 1
    step = np.where(idx >= 0, ms[np.maximum(idx, 0)], -1)
    inside = idx >= 0
    if len(mt) >= 2 and ended:
        inside &= t < mt[-1]
    elif len(mt) >= 2:
        typical = float(np.median(np.diff(mt)))
        inside &= t <= mt[-1] + 2.0 * max(typical, 0.0) + 1e-9
    return Marked(step, inside, float(mt[0]), int(ms[0]))


def judged_part(
    t: np.ndarray,
    v: np.ndarray,
    steps: Sequence[tuple[float, int]],
    s: WarmUp,
    *,
    steps_only: bool = False,
    full_span: float = 0.0,
    ended: bool = False,
    any_steps: bool = False,
) -> Judged | None:
    """The judged part of a run so far, as the module docstring's rules say; None: nothing
    to judge (too few samples, or too few judged steps with `steps_only`). `any_steps`: by
    steps however few are judged (the classifier's floors of a run too short to judge)."""
    tt, vv = t, v
    if steps:
        step, inside, _, first = step_index(t, steps, ended)
        if inside.any():
            # From the first marker, read or not: on a loaded machine the first markers of a
            # fast loop may reach the reader together, and only the last of them is read.
            last = int(step[inside].max())
            warm = max(s.warmup_steps, math.ceil(s.warmup_step_fraction * (last - first + 1)))
            judged = inside & (step >= first + warm)
            n_judged = last - (first + warm) + 1
            if judged.any() and (n_judged >= s.min_blocks or any_steps):
                return Judged(step[judged].astype(float), v[judged], float(n_judged), "step")
        tt, vv = t[inside], v[inside]
    elif ended:
        tt, vv = _before_exit(t, v)
    if steps_only or len(tt) < 2:
        return None
    span = max(float(tt[-1] - tt[0]), full_span)
    judged = tt >= tt[0] + s.warmup_fraction * span
    x = tt[judged]
    if len(x) < 2:
        return None
    return Judged(x, vv[judged], float(x[-1] - x[0]), "s")


# The longest an interpreter's exit is taken to free memory for (rule 3), in seconds.
EXIT_S = 1.0


def _before_exit(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A run without markers that ended by itself, less its exit (rule 3): the readings at
    its end that each fell below the one before, within `EXIT_S` of its last reading."""
    i = len(v) - 1
    while i > 0 and v[i] < v[i - 1] and t[i - 1] >= t[-1] - EXIT_S:
        i -= 1
    return t[: i + 1], v[: i + 1]


def _percentile(ordered: np.ndarray, q: float) -> float:
    """np.percentile(values, q) of already sorted values, by numpy's own arithmetic
    ("linear": virtual index (n - 1) x q / 100, interpolated as its `_lerp` does), without
    its per-call overhead: the blocks' floors are most of a look's time."""
    n = len(ordered)
    virtual = (n - 1) * (q / 100.0)
    if virtual >= n - 1:
        return float(ordered[-1])
    lo = math.floor(virtual)
    g = virtual - lo
    a, b = float(ordered[lo]), float(ordered[lo + 1])
    d = b - a
    return b - d * (1.0 - g) if g >= 0.5 else a + d * g


def _median(ordered: np.ndarray) -> float:
    """np.median of already sorted values (the middle one, or the mean of the middle two)."""
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (float(ordered[mid - 1]) + float(ordered[mid])) / 2


def _held(v: np.ndarray) -> np.ndarray:
    """The level each reading and the next held together (the last: none, +inf)."""
    held = np.full(len(v), np.inf)
    if len(v) > 1:
        held[:-1] = np.maximum(v[:-1], v[1:])
    return held


def _window_min(x: np.ndarray, level: np.ndarray, span: float) -> np.ndarray:
    """For each sample, the least `level` of the samples after it within `span` of x
    (+inf where there is none): a monotone deque, one pass from the end."""
    out = np.full(len(x), np.inf)
    # Indices after i, nearest on the left; their levels fall from left to right, so the
    # least level in reach is the rightmost one (the farthest survivor).
    ahead: deque[int] = deque()
    for i in range(len(x) - 1, -1, -1):
        while ahead and x[ahead[-1]] > x[i] + span:
            ahead.pop()
        if ahead:
            out[i] = level[ahead[-1]]
        while ahead and level[ahead[0]] >= level[i]:
            ahead.popleft()
        ahead.appendleft(i)
    return out


def excursions(x: np.ndarray, v: np.ndarray, s: Threshold) -> np.ndarray:
    """Which judged samples lie inside an excursion (the module docstring): a mask."""
    if len(v) < 3:
        return np.zeros(len(v), dtype=bool)
    span = 2.0 * float(x[-1] - x[0]) / s.min_blocks
    first = v[x <= x[0] + span / 2]
    height = threshold_mib(s, _percentile(np.sort(first), s.floor_percentile))
    held = _held(v)
    after = _window_min(x, held, span)
    # Before: the same pass over the reversed series (levels held up to and with i - 1).
    before = _window_min(-x[::-1], held[::-1], span)[::-1]
    # Where no level is held after (or before) a sample, that side is +inf: never below it.
    above_after = v - after >= height
    # The series' opening stretch, where every level held stands T above a level held
    # after it: its level before lies before the judged part (a spike the warm-up cut
    # into; a single low reading at its start is no level). The last reading holds no
    # level (inf - inf: not above).
    with np.errstate(invalid="ignore"):
        opening = np.logical_and.accumulate(held - after >= height)
    return opening | (above_after & (v - before >= height))


def block_floors(
    x: np.ndarray,
    v: np.ndarray,
    n_blocks: int,
    min_block_samples: int,
    percentile: float,
    keep: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, floors, wide floors) of the usable blocks, as the module docstring says;
    `keep` (a mask): the samples floors may be taken from (the rest lie in excursions)."""
    lo, hi = float(x[0]), float(x[-1])
    if keep is not None:
        x, v = x[keep], v[keep]
    edges = np.linspace(lo, hi, n_blocks + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, n_blocks - 1)
    order = np.argsort(which, kind="stable")  # each block's samples side by side
    xs, vs = x[order], v[order]
    bounds = np.searchsorted(which[order], np.arange(n_blocks + 1))
    keep_b = [b for b in range(n_blocks) if bounds[b + 1] - bounds[b] >= min_block_samples]
    pos = [_median(np.sort(xs[bounds[b] : bounds[b + 1]])) for b in keep_b]
    floors = [_percentile(np.sort(vs[bounds[b] : bounds[b + 1]]), percentile) for b in keep_b]
    # A block and its two neighbours are side by side too.
    wide = [
        _percentile(np.sort(vs[bounds[max(b - 1, 0)] : bounds[min(b + 2, n_blocks)]]), percentile)
        for b in keep_b
    ]
    return np.array(pos), np.array(floors), np.array(wide)


def count_floors(
    x: np.ndarray, v: np.ndarray, n_blocks: int, percentile: float, keep: np.ndarray,
    whole: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As `block_floors`, but each block holds about an equal share of the kept samples (in
    x order) instead of an equal width of x: the classifier's last resort when stretches
    without samples leave too few equal-width blocks usable. `whole` (x is a step): a step's
    samples never split between two blocks, so no two blocks are the same step's; the
    blocks are then as many as the steps allow (at most `n_blocks`)."""
    xs, vs = x[keep], v[keep]
    if whole:
        _, starts = np.unique(xs, return_index=True)  # where each step's samples begin
        share = len(xs) // n_blocks  # >= min_block_samples: n_blocks <= len // that
        cuts = [0]
        for start in starts[1:]:
            if start - cuts[-1] >= share and len(xs) - start >= share:
                cuts.append(int(start))
        bounds = np.array([*cuts, len(xs)])
    else:
        bounds = np.linspace(0, len(xs), n_blocks + 1).round().astype(int)
    pairs = list(zip(bounds, bounds[1:], strict=False))
    pos = [_median(np.sort(xs[a:b])) for a, b in pairs]
    floors = [_percentile(np.sort(vs[a:b]), percentile) for a, b in pairs]
    k = len(pairs)
    wide = [
        _percentile(np.sort(vs[bounds[max(i - 1, 0)] : bounds[min(i + 2, k)]]), percentile)
        for i in range(k)
    ]
    return np.array(pos), np.array(floors), np.array(wide)


def largest_drop(wide: np.ndarray) -> float:
    """The deepest fall of the (wide) floor below its running maximum, in MiB."""
    return float(np.max(np.maximum.accumulate(wide) - wide))


def steps_done(steps: Sequence[tuple[float, int]]) -> int:
    """How many steps the markers span (0 without markers)."""
    return max(s for _, s in steps) - min(s for _, s in steps) + 1 if steps else 0


def step_ratio(x: np.ndarray, y: np.ndarray, slope: float) -> float:
    """How much better one jump explains the floors than a straight line does.

    Sum of absolute deviations from the best two-level step (each level at its
    median) divided by those from the Theil-Sen line. A one-off allocation gives
    a small ratio; a leak, whose rise is spread over the whole window, a ratio
    near or above 1.
    """
    line = float(np.abs(y - slope * x - np.median(y - slope * x)).sum())
    n = len(y)
    best = math.inf
    for k in range(2, n - 1):
        a, b = y[:k], y[k:]
        best = min(best, float(np.abs(a - np.median(a)).sum() + np.abs(b - np.median(b)).sum()))
    if line <= 0:
        return math.inf if best > 0 else 1.0
    return best / line
