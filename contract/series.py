"""Bounded memory series: downsampling that keeps what the classifier and a reader need.

A trial samples at 10-50 Hz; an hour-long run is 36,000+ samples and a report carries at
most `contract.wire.MAX_REPORT_SAMPLES`. Averaging would hide exactly what matters: the
classifier judges the *floor* of the curve (a leak raises it) against its spikes (a
checkpoint raises the ceiling only). So `downsample` cuts the run into equal time buckets
and keeps, from each bucket, the samples holding the minimum and the maximum of each
series (host RSS, and GPU memory where any sample has it), in time order. Floors and
spikes survive; so do the first and the last sample, the global minimum and maximum of
each series, and every sample's own fields (a kept sample is one that was taken, never a
blend). Pure: no I/O. The status page draws its curves with the same function.
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.wire import Sample


def _series(samples: Sequence[Sample]) -> list[str]:
    keys = ["rss"]
    if any(s.gpu is not None for s in samples):
        keys.append("gpu")
    return keys


def _extremes(samples: Sequence[Sample], lo: int, hi: int, key: str) -> tuple[int, int] | None:
    """Indices of the minimum and maximum of `key` in samples[lo:hi] (None values skipped)."""
    best_min = best_max = None
    vmin = vmax = 0
    for i in range(lo, hi):
        v = getattr(samples[i], key)
        if v is None:
            continue
        if best_min is None or v < vmin:
            best_min, vmin = i, v
        if best_max is None or v > vmax:
            best_max, vmax = i, v
    if best_min is None or best_max is None:
        return None
    return best_min, best_max


def downsample(samples: Sequence[Sample], max_points: int) -> list[Sample]:
    """At most `max_points` of `samples`: per time bucket, the min and max of each series.

    `samples` must be in time order (as a trial takes them). Fewer than `max_points`
    come back unchanged. The first and last samples are always kept; buckets split the
    time span evenly, so a gap in sampling leaves empty buckets (fewer points), never
    more than `max_points`.
    """
    if max_points < 4:
        raise ValueError("max_points must be at least 4 (first, last, a minimum, a maximum)")
    n = len(samples)
    if n <= max_points:
        return list(samples)
    keys = _series(samples)
    buckets = max(1, (max_points - 2) // (2 * len(keys)))
    t0, t1 = samples[0].t, samples[-1].t
    span = (t1 - t0) or 1.0
    keep = {0, n - 1}
    lo = 0
    for b in range(buckets):
        end_t = t0 + span * (b + 1) / buckets
        hi = lo
        while hi < n and (samples[hi].t < end_t or b == buckets - 1):
            hi += 1
        for key in keys:
            found = _extremes(samples, lo, hi, key)
            if found is not None:
                keep.update(found)
        lo = hi
    return [samples[i] for i in sorted(keep)]
