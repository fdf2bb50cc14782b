"""Early stopping: end a trial as soon as its verdict can no longer change.

Pure: samples, step markers and an `EarlyStop` (contract/wire.py) in, None or a one-line
reason out; no I/O, no clock. An `EarlyStopper` holds one trial's looks: the watch loop
(runners/watch.py, for both executors) calls its `look` every `look_every_s` over
the samples and the markers they reach (`seen_by_samples`), and `replay` takes the same
looks over a finished trace (tests, the bench), so the same arithmetic runs live and in
replay. Its `record` (horizon and looks tested) is what the runner reports; `live_state` says
in words which rules can act on a running trial (a display's, never a decision).

What a look judges is the judged part of contract/floors.py, the classifier's own: never
what comes before the first step marker. When the job's runs print markers (the horizon
knows steps) a look judges by steps only, never by seconds.

Rules, in this order:

1. Cap near, at any horizon or none: the newest host sample is at least `cap_fraction`
   of the memory cap and the floor of the judged part rose (the floor of its last
   quarter is the threshold T or more above that of its first quarter, as the
   classifier's OOM rule measures it). The judged part is by steps when the horizon
   knows steps (no marker yet: nothing to judge), else by seconds with the warm-up at
   least warmup_fraction x the horizon. The cap would kill the trial anyway and the
   classifier calls an OOM kill with a rising floor a leak; stop now.
2. No leak look unless the horizon knows steps (the job's full runs printed markers) and
   lasted at least MIN_HORIZON_S.
3. No leak look before `min_fraction` of the horizon's steps are printed: the run's own
   progress, so a run slowed by a loaded machine is judged on the work it did, not on
   the clock (nothing here assumes the horizon's pace).
4. The judged part by steps only (contract/floors.py `judged_part`, `steps_only`): set-up
   before the first marker, teardown and warm-up steps dropped; fewer than `min_blocks`
   usable blocks (so fewer than min_blocks judged steps): no look.
5. At most m = `max_looks()` leak looks, the looks a run at the horizon's pace takes
   (horizon_s x (1 - min_fraction) / look_every_s, plus one); only a look that gets here
   counts (`EarlyStopper.looks`), and none is tested after the m-th. Each tests at level
   alpha / m, alpha = 1 - confidence (Bonferroni). Proof that a clean trial is stopped
   with probability at most alpha however many looks its wall time offers: P(some look
   stops it) <= sum over the tested looks of P(that look stops it) <= m x alpha / m.
   A run slower than its horizon spends its m looks earlier in its work, then runs to
   its end and is judged there.
6. Leak: it stops when all hold:
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

Why never by seconds (rule 2): without markers a look cannot tell how far a run has got,
and a loaded machine stretches everything. Replayed on the nine bounded shapes of the
engine.synthetic corpus without markers (seeds 0..39 each, horizon 120 s, looks every
5 s), this rule judging seconds instead (warm-up at least 20 % of the horizon) stopped no
run at the horizon's pace, but 9 of 360 slowed 2x (a memory-mapped file still being read
at half the horizon) and 73 of 360 slowed 3x; at a 60 s horizon 48 and 153 of 360.

Why MIN_HORIZON_S = 60 s (rule 2): a stop saves at most (1 - min_fraction) x horizon: 30 s
of a 60 s run, 2.25 s of the orbax case's 4.5 s, 1 s of the 2 s fixture; a false stop
costs a wrong verdict. The risk is not flat in the horizon either: processes that take
seconds (a model load, threads and arenas starting, a GC settling) span many steps of a
short loop, and their rise over the steps up to a look reads as a leak. Replayed on the
bounded shapes with markers, this bound off (docs/benchmarks.md section 8, 40 seeds of
each of the nine, 360 runs a cell): horizons of 7 s and 15 s stopped 89 of 360 slowed 2x,
and 25 (idle) and 27 (slowed) of 360; horizons of 25 s, 45 s and 64 s none, idle or
slowed 2x. 60 s is four times the longest horizon that stopped a bounded run, a repro
of minutes is above it, and a stop there saves at least 30 s.

Measured with the bound (docs/benchmarks.md section 8): of 4500 bounded runs with markers
(the nine shapes, 250 seeds each, idle and slowed 2x), none was stopped: the upper end of
the 95 % interval is 0.085 % (Wilson; 0.082 % exact), under the target of 0.1 % a run.
Leaks behind heavy imports were stopped in 200 of 200 (fast), 189 of 200 (with spikes)
and 159 of 200 (slow) runs, at 53 to 69 % of the run on average. tests/test_earlystop.py
and tests/test_synthetic_corpus.py pin the counts for fixed seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from contract.floors import (
    Judged,
    block_floors,
    excursions,
    judged_part,
    largest_drop,
    steps_done,
)
from contract.theilsen import theilslopes
from contract.wire import MIN_HORIZON_S, EarlyStop, EarlyStopRecord

MIB = 1024 * 1024


def max_looks(es: EarlyStop) -> int:
    """The Bonferroni m: the leak looks a trial at the horizon's pace takes (at least 1)."""
    if es.horizon_s is None:
        return 1
    span = es.horizon_s * (1.0 - es.min_fraction)
    return max(1, math.ceil(span / es.look_every_s) + 1)


def _threshold(es: EarlyStop, baseline: float) -> float:
    return max(es.min_growth_mib, es.min_growth_fraction * max(baseline, 0.0))


def _part(
    t: np.ndarray, v: np.ndarray, steps: Sequence[tuple[float, int]], es: EarlyStop
) -> Judged | None:
    """The judged part (contract/floors.py): by steps only when the job's runs print
    markers; by seconds otherwise, the warm-up at least what a whole run would drop."""
    return judged_part(
        t, v, steps, es, steps_only=es.horizon_steps is not None, full_span=es.horizon_s or 0.0
    )


def _cap_near(
    t: np.ndarray, rss_mib: np.ndarray, steps: Sequence[tuple[float, int]],
    limit_bytes: int | None, es: EarlyStop,
) -> str | None:  # fmt: skip
    if not limit_bytes or rss_mib[-1] < es.cap_fraction * limit_bytes / MIB:
        return None
    limit = limit_bytes / MIB
    part = _part(t, rss_mib, steps, es)  # after the warm-up, as the classifier's OOM rule
    if part is None or len(part.v) < 8:
        return None
    v = part.v
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


def _floors(part: Judged, es: EarlyStop) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The judged part's block floors, None when fewer than min_blocks are usable."""
    n_blocks = min(max(len(part.v) // es.block_samples, es.min_blocks), es.max_blocks)
    if part.per == "step":
        n_blocks = min(n_blocks, len(np.unique(part.x)))  # only distinct steps form blocks
    fx, floors, wide = block_floors(
        part.x, part.v, n_blocks, es.min_block_samples, es.floor_percentile,
        ~excursions(part.x, part.v, es),
    )  # fmt: skip
    if len(floors) < es.min_blocks or part.window <= 0:
        return None
    return fx, floors, wide


def _leak(
    fx: np.ndarray, floors: np.ndarray, wide: np.ndarray, part: Judged, es: EarlyStop,
    confidence: float,
) -> str | None:  # fmt: skip
    window, per = part.window, part.per
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
    if largest_drop(wide) >= es.max_drop_ratio * threshold:
        return None
    over = f"{window:.0f} steps" if per == "step" else f"{window:.0f} s"
    return (
        f"floor grew at least {low * window:.0f} MiB over {over} at {confidence:.2%} "
        f"confidence (threshold {threshold:.0f} MiB), still rising at the end "
        f"({late:.3g} MiB/{per}, at least {late_low:.3g})"
    )


@dataclass
class EarlyStopper:
    """One trial's early stopping: its settings and the leak looks it has tested.

    Pure and stateful (no clock): the watch loop calls `look` every `look_every_s`;
    `looks` counts only the looks that reached the leak test (rule 5), and `record` is
    what the runner reports. `min_horizon_s` is MIN_HORIZON_S but for tests that
    isolate another rule.
    """

    es: EarlyStop
    min_horizon_s: float = MIN_HORIZON_S
    looks: int = 0

    @property
    def budget(self) -> int:
        return max_looks(self.es)

    @property
    def level(self) -> float:
        """The confidence each leak look tests at: 1 - (1 - confidence) / m."""
        return 1.0 - (1.0 - self.es.confidence) / self.budget

    def look(
        self,
        t: Sequence[float],
        rss: Sequence[float],
        steps: Sequence[tuple[float, int]],
        limit_bytes: int | None,
    ) -> str | None:
        """None, or why the trial may stop now (the rules of the module docstring, in order)."""
        es = self.es
        tt = np.asarray(t, dtype=float)
        vv = np.asarray(rss, dtype=float) / MIB
        if len(tt) == 0:
            return None
        cap = _cap_near(tt, vv, steps, limit_bytes, es)
        if cap is not None:
            return f"the memory cap is near: {cap}"
        if es.horizon_s is None or es.horizon_s < self.min_horizon_s or not es.horizon_steps:
            return None
        if steps_done(steps) < es.min_fraction * es.horizon_steps:
            return None
        part = _part(tt, vv, steps, es)
        blocks = None if part is None else _floors(part, es)
        if part is None or blocks is None or self.looks >= self.budget:
            return None
        self.looks += 1
        return _leak(*blocks, part, es, self.level)

    def record(self) -> EarlyStopRecord:
        return EarlyStopRecord(
            horizon_s=self.es.horizon_s, horizon_steps=self.es.horizon_steps, looks=self.looks
        )


def live_state(es: EarlyStop | None, steps: int, min_horizon_s: float = MIN_HORIZON_S) -> str:
    """What the rules allow a running trial now, in words, for `bisect-cli run`'s status line.

    "off": the job turned early stopping off. "cap only": rule 2, no leak look (the job has no
    full run of `min_horizon_s` or more with step markers yet); rule 1 still stops a trial
    near its memory cap. "from step N": rule 3, no leak look before N steps (`steps`: those
    the markers so far span). "looking": rules 4 to 6 decide at each look.
    """
    if es is None:
        return "off"
    if es.horizon_s is None or es.horizon_s < min_horizon_s or not es.horizon_steps:
        return "cap only"
    start = math.ceil(es.min_fraction * es.horizon_steps)
    return "looking" if steps >= start else f"from step {start}"


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


@dataclass(frozen=True)
class Replay:
    """The looks of a live trial replayed over a finished trace: when and why it would have
    stopped (None: it runs to its end) and how many leak looks it tested."""

    at: float | None
    reason: str | None
    looks: int


def replay(
    t: Sequence[float],
    rss: Sequence[float],
    steps: Sequence[tuple[float, int]],
    limit_bytes: int | None,
    stopper: EarlyStopper | EarlyStop,
) -> Replay:
    """A look every `look_every_s` of the trace's clock, each over the samples so far and the
    markers they reach (a sample carries the newest marker before it), as the watch loop."""
    if isinstance(stopper, EarlyStop):
        stopper = EarlyStopper(stopper)
    tt = np.asarray(t, dtype=float)
    vv = np.asarray(rss, dtype=float)
    marks = sorted(steps)
    mark_t = np.array([m[0] for m in marks])
    look = stopper.es.look_every_s
    while len(tt) and look <= tt[-1]:
        k = int(np.searchsorted(tt, look, side="right"))
        seen = marks[: int(np.searchsorted(mark_t, tt[k - 1], side="right"))] if k else []
        reason = stopper.look(tt[:k], vv[:k], seen, limit_bytes)
        if reason is not None:
            return Replay(look, reason, stopper.looks)
        look += stopper.es.look_every_s
    return Replay(None, None, stopper.looks)


def first_stop(
    t: Sequence[float],
    rss: Sequence[float],
    steps: Sequence[tuple[float, int]],
    limit_bytes: int | None,
    es: EarlyStop,
) -> tuple[float, str] | None:
    """(time, reason) of the first look of `replay` that stops the trial, or None."""
    r = replay(t, rss, steps, limit_bytes, es)
    return None if r.at is None or r.reason is None else (r.at, r.reason)
