"""Block floors: the one definition the classifier (service/analysis.py) and the early-stop
rule (runners/earlystop.py) share. Pure.

The judged samples are cut into equal-width blocks over x (seconds or steps); a block
with fewer than `min_block_samples` samples is dropped; each kept block gives its
position (median x), its floor (`percentile` of its values) and its wide floor (the same
percentile over the block and its two neighbours: steadier, and blind to a spike that
swallows a whole block, which is what the drop test needs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np


def block_floors(
    x: np.ndarray, v: np.ndarray, n_blocks: int, min_block_samples: int, percentile: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, floors, wide floors) of the usable blocks, as the module docstring says."""
    lo, hi = float(x[0]), float(x[-1])
    edges = np.linspace(lo, hi, n_blocks + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, n_blocks - 1)
    groups = [v[which == b] for b in range(n_blocks)]
    keep = [b for b in range(n_blocks) if len(groups[b]) >= min_block_samples]
    xs = np.array([float(np.median(x[which == b])) for b in keep])
    fs = np.array([float(np.percentile(groups[b], percentile)) for b in keep])
    wide = np.array(
        [
            float(np.percentile(np.concatenate(groups[max(b - 1, 0) : b + 2]), percentile))
            for b in keep
        ]
    )
    return xs, fs, wide


class WarmUp(Protocol):
    warmup_fraction: float
    warmup_steps: int
    warmup_step_fraction: float
    min_blocks: int


def judged_part(
    t: np.ndarray, v: np.ndarray, steps: Sequence[tuple[float, int]], s: WarmUp
) -> tuple[np.ndarray, np.ndarray, float, str] | None:
    """(x, values, window, "step" | "s") of a run so far after its warm-up, None if empty.

    As the classifier: with markers, samples before the first one and the first
    max(warmup_steps, ceil(warmup_step_fraction x steps)) steps are dropped, and x is
    the step; with fewer judged steps than min_blocks, or no markers, the first
    warmup_fraction of the time is dropped and x is the time.
    """
    if steps:
        mt = np.array([m[0] for m in steps], dtype=float)
        ms = np.array([m[1] for m in steps])
        if np.any(np.diff(ms) < 0):
            ms = np.arange(len(ms))  # counters that go back: count markers instead
        idx = np.searchsorted(mt, t, side="right") - 1
        step = np.where(idx >= 0, ms[np.maximum(idx, 0)], -1)
        first, last = int(ms.min()), int(ms.max())
        warm = max(s.warmup_steps, math.ceil(s.warmup_step_fraction * (last - first + 1)))
        judged = (idx >= 0) & (step >= first + warm)
        if judged.any() and last - (first + warm) + 1 >= s.min_blocks:
            return step[judged].astype(float), v[judged], float(last - (first + warm) + 1), "step"
    if len(t) < 2:
        return None
    judged = t >= t[0] + s.warmup_fraction * (t[-1] - t[0])
    x = t[judged]
    return x, v[judged], float(x[-1] - x[0]), "s"
