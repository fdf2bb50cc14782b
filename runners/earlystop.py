"""Early stopping: end a trial as soon as its verdict can no longer change.

Pure: samples, step markers and an `EarlyStop` (runners/wire.py) in, None or a
one-line reason out; no I/O, no clock. The executor looks at most every
`look_every_s` (runners/executor.py); `first_stop` replays the same looks over a
finished trace (tests, the bench).

Rules, in this order:

1. Cap near: the newest host sample is at least `cap_fraction` of the memory cap
   and the floor is rising (the floor of the last quarter of the samples is the
   threshold T or more above that of the first quarter, after the warm-up, as
   the classifier's OOM rule measures it). The cap would kill the trial anyway and the classifier
   calls an OOM kill with a rising floor a leak; stop now. Applies with or
   without a horizon.
2. No horizon (no trial of the job has run to its end yet): nothing else.
3. Leak, only once `min_fraction` of the horizon is observed (steps when the
   script prints markers and the horizon knows steps, else seconds). The judged
   part is what the classifier would judge of the run so far (same warm-up, same
   blocks, same floors: runners/floors.py); fewer than `min_blocks` usable
   blocks: no look. With m = `max_looks()` looks at most, each look tests at
   level (1 - confidence) / m (Bonferroni), so the chance that any look of a
   clean trial stops it stays under 1 - confidence. It stops when all hold:
   - the lower bound of the Theil-Sen slope x the judged window clears
     `margin` x T, T = max(min_growth_mib, min_growth_fraction x baseline);
   - late growth: over the last `late_fraction` of the floors the lower bound
     of the slope is > 0 and at least `leak_late_ratio` x the overall lower
     bound, and the slope is at least `leak_late_ratio` x max(overall slope,
     rise rate as the classifier computes it) and at least `saturation_ratio` x
     the early slope (a cache that filled and stopped, or whose fill ends right
     at the look, fails here);
   - the floor never fell back by `max_drop_ratio` x T below its running maximum.

A trial that is not stopped runs to its end and is judged as before; clean
candidates therefore always run to the end.

Measured on service.synthetic traces (120 s runs, horizon = the run, looks every
5 s; 400-step runs with markers, looks every 2 s; seeds 0..99): flat, spikes,
sawtooth, cache (also with its fill ending at 30, 45, 50 and 55 % of the run),
late_step, gpu_plateau and the stepped flat, spikes and cache runs were never
stopped (0/100 each); fast_leak and the stepped leak always were (100/100, fast
leaks at 40 %/min at the first eligible look), leak_spikes 90/100; the 0.5 %/min
slow leak over 15 minutes 0/20 (it runs to its end and the classifier judges it).
tests/test_earlystop.py pins these for seeds 0..19.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from runners.floors import block_floors, judged_part
from runners.wire import EarlyStop

MIB = 1024 * 1024


def max_looks(es: EarlyStop) -> int:
    """How many leak looks a trial of the horizon can take (at least 1): the Bonferroni m."""
    if es.horizon_s is None:
        return 1
    span = es.horizon_s * (1.0 - es.min_fraction)
    return max(1, math.ceil(span / es.look_every_s) + 1)


def _threshold(es: EarlyStop, baseline: float) -> float:
    return max(es.min_growth_mib, es.min_growth_fraction * max(baseline, 0.0))


def _cap_near(
    t: np.ndarray, rss_mib: np.ndarray, steps: Sequence[tuple[float, int]],
    limit_bytes: int | None, es: EarlyStop,
) -> str | None:  # fmt: skip
    if not limit_bytes or rss_mib[-1] < es.cap_fraction * limit_bytes / MIB:
        return None
    limit = limit_bytes / MIB
    part = judged_part(t, rss_mib, steps, es)  # after the warm-up, as the classifier's OOM rule
    if part is None or len(part[1]) < 8:
        return None
    v = part[1]
    q = len(v) // 4
    first = float(np.percentile(v[:q], es.floor_percentile))
    last = float(np.percentile(v[-q:], es.floor_percentile))
    threshold = _threshold(es, first)
    if last - first < threshold:
        return None
    return (
        f"memory at {rss_mib[-1]:.0f} MiB, {rss_mib[-1] / limit:.0%} of the {limit:.0f} MiB "
        f"cap, after the floor rose {last - first:.0f} MiB (threshold {threshold:.0f} MiB)"
    )


def _observed(t: np.ndarray, steps: Sequence[tuple[float, int]], es: EarlyStop) -> float:
    """The observed share of the horizon: steps when both sides count steps, else seconds."""
    if steps and es.horizon_steps:
        done = max(s for _, s in steps) - min(s for _, s in steps) + 1
        return done / es.horizon_steps
    assert es.horizon_s
    return float(t[-1]) / es.horizon_s


def _leak(
    t: np.ndarray, v: np.ndarray, steps: Sequence[tuple[float, int]], es: EarlyStop
) -> str | None:
    from scipy.stats import theilslopes  # about a second to import; only trials with a horizon

    part = judged_part(t, v, steps, es)
    if part is None:
        return None
    x, vv, window, per = part
    n_blocks = min(max(len(vv) // es.block_samples, es.min_blocks), es.max_blocks)
    fx, floors, wide = block_floors(x, vv, n_blocks, es.min_block_samples, es.floor_percentile)
    if len(floors) < es.min_blocks or window <= 0:
        return None
    confidence = 1.0 - (1.0 - es.confidence) / max_looks(es)
    slope, _, low, _ = theilslopes(floors, fx, alpha=confidence)
    threshold = _threshold(es, float(floors[0]))
    if low * window < es.margin * threshold:
        return None
    n_late = min(len(floors), max(es.late_min_blocks, math.ceil(es.late_fraction * len(floors))))
    late, _, late_low, _ = theilslopes(floors[-n_late:], fx[-n_late:], alpha=confidence)
    early = theilslopes(floors[:n_late], fx[:n_late])[0]
    # As the classifier: against the steady rate that would have produced the rise too,
    # so growth packed into the early blocks (a cache filling) is not read as a pace.
    span = float(np.median(fx[-n_late:]) - fx[0])
    rise_rate = (float(np.median(floors[-n_late:])) - float(floors[0])) / span if span > 0 else 0.0
    reference = max(slope, rise_rate)
    # The late lower bound must keep up with the overall one: a cache whose fill ends
    # right where the look is taken still has a positive, but much less certain, late slope.
    late_ok = late_low > 0 and late_low >= es.leak_late_ratio * low
    if not late_ok or late < es.leak_late_ratio * reference or late < es.saturation_ratio * early:
        return None
    drop = float(np.max(np.maximum.accumulate(wide) - wide))
    if drop >= es.max_drop_ratio * threshold:
        return None
    over = f"{window:.0f} steps" if per == "step" else f"{window:.0f} s"
    return (
        f"floor grew at least {low * window:.0f} MiB over {over} at {confidence:.2%} "
        f"confidence (threshold {threshold:.0f} MiB), still rising at the end "
        f"({late:.3g} MiB/{per}, at least {late_low:.3g})"
    )


def should_stop(
    t: Sequence[float],
    rss: Sequence[float],
    steps: Sequence[tuple[float, int]],
    limit_bytes: int | None,
    es: EarlyStop,
) -> str | None:
    """None, or why the trial may stop now (the rules of the module docstring, in order)."""
    tt = np.asarray(t, dtype=float)
    vv = np.asarray(rss, dtype=float) / MIB
    if len(tt) == 0:
        return None
    cap = _cap_near(tt, vv, steps, limit_bytes, es)
    if cap is not None:
        return f"the memory cap is near: {cap}"
    if es.horizon_s is None or _observed(tt, steps, es) < es.min_fraction:
        return None
    return _leak(tt, vv, steps, es)


def seen_by_samples(
    steps: Sequence[tuple[float, int]], sample_step: int | None
) -> list[tuple[float, int]]:
    """The markers up to the one the newest sample carries (`Sample.step`), for a live look.

    A marker can land between the newest sample and a look; judged with it, a run could
    stop at a step its stored samples never reach, and the series the classifier judges
    would hold less than the look saw. Markers the samples do not show wait for the next
    look.
    """
    for i in range(len(steps) - 1, -1, -1):
        if steps[i][1] == sample_step:
            return list(steps[: i + 1])
    return []


def first_stop(
    t: Sequence[float],
    rss: Sequence[float],
    steps: Sequence[tuple[float, int]],
    limit_bytes: int | None,
    es: EarlyStop,
) -> tuple[float, str] | None:
    """The looks of a live trial replayed over a finished trace: (time, reason) of the first
    look that stops it, or None when it would run to its end."""
    tt = np.asarray(t, dtype=float)
    vv = np.asarray(rss, dtype=float)
    marks = sorted(steps)
    look = es.look_every_s
    while len(tt) and look <= tt[-1]:
        k = int(np.searchsorted(tt, look, side="right"))
        seen = [m for m in marks if m[0] <= look]
        reason = should_stop(tt[:k], vv[:k], seen, limit_bytes, es)
        if reason is not None:
            return look, reason
        look += es.look_every_s
    return None
