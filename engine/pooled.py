"""Pooled evidence: the runs of one candidate judged together before any vote.

Pure, like engine/analysis.py, whose per-run numbers it reads: each run's analysis
(`RunAnalysis.to_dict()`, stored on its trial) already holds, per series, the block
floors and the Theil-Sen fit of them, so pooling costs microseconds and never has
to reload a run's samples.

Why pool: a run whose slope interval straddles the threshold is INCONCLUSIVE, and a
majority vote of n such runs is INCONCLUSIVE too, however many there are. Their
slopes together are known sqrt(n) times better. How (per series, host and GPU
separately, over the runs that have one):

1. A run is pooled when it ended normally (exit 0, not killed by the cap, not timed
   out), its verdict is LEAK, CLEAN, PLATEAU or INCONCLUSIVE and its series has at
   least `min_blocks` floors in the unit of the first such run (MiB/step or MiB/s).
2. Slope: a random-effects meta-analysis of the per-run Theil-Sen slopes. A run's
   standard error is the width of its interval over 2 z; the between-run variance
   tau^2 is DerSimonian-Laird's, so runs that disagree beyond their own noise widen
   the pooled interval instead of averaging a leak away. The pooled interval is
   slope +- z x se at the classifier's `confidence`.
3. The pooled threshold is a rate: min over runs of T_i / window_i, the tightest
   run's (the longest judged window). Growth is that rate's run's window times the
   pooled slope, so the pooled call means what one run's call means, "grows by T
   over the judged window", on the longest run there is.
4. Shape, pooled: the late slope is the same meta-analysis of the per-run late
   slopes (their upper bound gives the standard error); early slope and rise rate
   are the mean of the runs'; the rise and the end rise (median late floor, and the
   floor of the last two blocks, above the baseline) are averaged in units of each
   run's own T, so "rose" means the average run rose by its threshold.
5. Per-run checks kept: a run's step ratio and largest drop are its own (a one-off
   jump or a slow sawtooth is visible in each run, not in an average), and so is
   its verdict.

Pooled series verdicts, checked in this order:

- LEAK: slope_low > 0 and the pooled slope reaches the rate threshold; the pooled
  late slope is at least `leak_late_ratio` x max(slope, rise rate) and
  `saturation_ratio` x the early slope; every pooled run's step ratio is above
  `max_step_ratio` and its floor never fell back by `max_drop_ratio` x its T; and
  fewer than half the pooled runs are PLATEAU. A cache that fills and stops, a
  one-off step and a slow sawtooth fail these, so pooling cannot add them up into
  a leak (noise alone makes one run in ten of a slow, noisy leak PLATEAU, hence
  "half", not "none").
- INCONCLUSIVE: the above holds for exactly two runs and not both are LEAK alone.
  DerSimonian-Laird's between-run variance from two runs is mostly zero whatever the
  spread (one degree of freedom), so two noisy flat runs that happen to tilt the same
  way would convict together: 1.7 % false leaks on 40-step flat runs under 10 MiB of
  noise before this rule (bench/classifier.py, "pooled runs"). Two runs may clear a
  candidate; convicting takes both alone, or a third run.
- PLATEAU: the average run rose by its T and even the pooled late slope's upper
  bound is at most `plateau_late_ratio` x the mean rise rate.
- INCONCLUSIVE: the average run rose by its T, or its last two blocks did: a rise
  pooling does not explain away.
- CLEAN: no pooled run is LEAK or PLATEAU and the pooled upper bound stays under the
  rate threshold.
- INCONCLUSIVE otherwise.

Why a meta-analysis and not one Theil-Sen fit over all runs' aligned floors: the
per-run intervals assume independent floors, and under correlated noise (40 short
steps, 2 s correlation) they are too narrow; the between-run term measures that from
the runs themselves and widens the interval, where a pooled fit would multiply the
overconfidence by n. Measured (docs/benchmarks.md, pooled table, 300 candidates a
row): pooled false leaks are at or under the vote's on every bounded row (worst: 1.7 %
pooled over 2 and 0.7 % over 3 runs against 2.7 % and 3.0 % by vote, on 40-step runs
under 10 MiB of noise, where one run alone gives 3.0 %; 0.3 % at most on the 1-minute
rows), and a leak is called "not leak" less often (3.7 % and 0.7 % against 10.3 % and
7.0 %). The price is more INCONCLUSIVE than the vote, which ignores inconclusive runs.

Runs too short to judge alone. A run with too few readings for `min_blocks` blocks (a
loop of a few steps, a fraction of a second without markers) is INCONCLUSIVE and keeps the
floors it has: each judged step's lowest reading, or its readings per second
(engine/analysis.py `_short`). The scheduler runs such a candidate again, asking for a
longer run, up to `max_runs`; when fewer than two runs pool as above, the runs that ended
normally with at least `SHORT_MIN` floors per step (short or not) are judged together. Only
per step: what a verdict needs is counted in steps, and a run without markers that is too
short alone is a fraction of a second (the sampler reads 100 times a second while a run is
young), whose windows of a few hundredths of a second would clear anything.

1. Slope: one Theil-Sen slope over the pairs within each run, never across two (each run
   has its own level), with Sen's interval from the summed variances: the seasonal Kendall
   slope (contract/theilsen.py `grouped_theilslopes`). The same over each run's last half
   of floors is the late slope.
2. The window and T are the median run's; growth = slope x window.
3. LEAK: at least three runs (two cannot tell their spread, as above), every run's own
   slope above zero, slope_low > 0, growth >= T, and the late slope at least
   `leak_late_ratio` x the slope (still rising at the end: a cache that filled in each
   run's first steps fails here).
4. CLEAN: even slope_high x window stays under T.
5. INCONCLUSIVE otherwise, naming the first LEAK rule that failed. The reason says the runs
   were pooled because each was too short.

The pooled run verdict combines host and GPU as a single run does (LEAK if either
leaks, else INCONCLUSIVE, PLATEAU, CLEAN). The candidate's verdict, `classify_runs`:

- Fewer than two pooled runs: `aggregate` of the runs' verdicts, exactly as before.
- Otherwise the pooled verdict stands for each pooled run, and the runs that were
  not pooled (errors, skips, runs killed by the cap or timed out) keep their own
  vote: `aggregate` of both. Three runs pooled to CLEAN beside one killed by the cap
  is CLEAN (3 to 1). A pooled INCONCLUSIVE counts as inconclusive runs, so one LEAK
  among noisy runs no longer wins the vote alone: the pooled evidence of all of them
  has to say LEAK (measured: that single-run LEAK is how noisy flat runs came out
  LEAK by vote).

Across evaluations, `classify_evaluations`. The planner evaluates a candidate again to
confirm it (engine/planner.py rule 4), and an evaluation that ends INCONCLUSIVE after its
`max_runs` runs is judged once more, with every run of the candidate's earlier evaluations
(`classify_runs` over all of them): an inconclusive evaluation contradicts nothing, and its
runs beside the earlier ones are more evidence, not a vote against them. The pooled
verdict is the evaluation's when all of these hold, else it stays INCONCLUSIVE:

- it is the pooled run verdict (two runs or more pooled, the latest evaluation's among
  them), not a vote: an earlier run that was not pooled (killed by the cap) cannot
  confirm its own evaluation;
- it is decisive and on the side of every earlier decisive evaluation (leak, or bounded:
  clean and plateau agree). Pooling never turns opposing evidence into a verdict: a leak
  evaluation pooled with runs that come out bounded together is not a confirmation, and a
  leak evaluation beside a clean one is a contradiction (flaky) that no pooling undoes:
  the planner reads the evaluations, and those two are both decisive.

The two-run rule above still applies: a leak evaluation of one run and an inconclusive one
of one run do not convict together. The reason names the evaluations pooled ("pooled over
N runs across evaluations 1 and 2: ...").

Rates on engine.synthetic traces: bench/classifier.py, "pooled runs" table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from contract.theilsen import grouped_theilslopes, theilslopes
from engine.analysis import ClassifierSettings, _fmt, aggregate
from engine.verdicts import Verdict

RUN_VERDICTS = (Verdict.LEAK, Verdict.CLEAN, Verdict.PLATEAU, Verdict.INCONCLUSIVE)
# A run too short to judge alone joins the short-run pool with at least this many floors.
SHORT_MIN = 3


@dataclass(frozen=True)
class PooledRun:
    """One run as the pool sees it: its verdict, its stored analysis, how it ended."""

    verdict: Verdict
    analysis: dict[str, Any] | None
    ended_normally: bool


@dataclass(frozen=True)
class PooledSeries:
    """The pooled numbers of one series over `runs` runs."""

    verdict: Verdict
    reason: str
    unit: str
    runs: int
    slope: float
    slope_low: float
    slope_high: float
    tau: float
    rate_threshold: float
    window: float
    threshold_mib: float
    growth_mib: float
    late_slope: float
    late_slope_high: float

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["verdict"] = self.verdict.value
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()
        }


@dataclass(frozen=True)
class PooledAnalysis:
    """A candidate's verdict from its runs together, with the pooled numbers behind it."""

    verdict: Verdict
    reason: str
    runs: int  # how many runs were pooled (0 or 1: none, the vote decided)
    pooled: Verdict | None  # the pooled run verdict, None when fewer than 2 runs pooled
    host: PooledSeries | None
    gpu: PooledSeries | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "runs": self.runs,
            "pooled": None if self.pooled is None else self.pooled.value,
            "host": None if self.host is None else self.host.to_dict(),
            "gpu": None if self.gpu is None else self.gpu.to_dict(),
        }


def _z(s: ClassifierSettings) -> float:
    return NormalDist().inv_cdf(0.5 + s.confidence / 2)


def _meta(est: Sequence[float], se: Sequence[float]) -> tuple[float, float, float]:
    """Random-effects (DerSimonian-Laird) mean of estimates: (mean, its se, tau)."""
    var = [max(x * x, 1e-18) for x in se]
    w = [1 / v for v in var]
    fixed = sum(wi * e for wi, e in zip(w, est, strict=True)) / sum(w)
    q = sum(wi * (e - fixed) ** 2 for wi, e in zip(w, est, strict=True))
    c = sum(w) - sum(wi * wi for wi in w) / sum(w)
    tau2 = max(0.0, (q - (len(est) - 1)) / c) if c > 0 else 0.0
    wr = [1 / (v + tau2) for v in var]
    mean = sum(wi * e for wi, e in zip(wr, est, strict=True)) / sum(wr)
    return mean, math.sqrt(1 / sum(wr)), math.sqrt(tau2)


def _rise_rate(series: dict[str, Any], s: ClassifierSettings) -> float:
    """The steady rate that would have produced the run's rise (as engine/analysis.py)."""
    fx = series["floor_x"]
    n_late = min(len(fx), max(s.late_min_blocks, math.ceil(s.late_fraction * len(fx))))
    late_x = sorted(fx[-n_late:])
    mid = len(late_x) // 2
    median_x = late_x[mid] if len(late_x) % 2 else (late_x[mid - 1] + late_x[mid]) / 2
    span = median_x - fx[0]
    return series["rise_mib"] / span if span > 0 else 0.0


def _usable(series: dict[str, Any] | None, s: ClassifierSettings) -> bool:
    needed = ("slope", "slope_low", "slope_high", "late_slope", "late_slope_high", "window")
    return (
        series is not None
        and len(series.get("floors_mib") or ()) >= s.min_blocks
        and all(series.get(k) is not None for k in needed)
        and (series["window"] or 0) > 0
    )


def _numbers(runs: list[dict[str, Any]], s: ClassifierSettings) -> dict[str, Any]:
    """The pooled numbers the rules read (rules 2 to 4 of the module docstring)."""
    z = _z(s)
    slope, se, tau = _meta(
        [d["slope"] for d in runs], [(d["slope_high"] - d["slope_low"]) / (2 * z) for d in runs]
    )
    late, late_se, _ = _meta(
        [d["late_slope"] for d in runs],
        [max(d["late_slope_high"] - d["late_slope"], 0.0) / z for d in runs],
    )
    tight = min(runs, key=lambda d: d["threshold_mib"] / d["window"])
    return dict(
        slope=slope,
        slope_low=slope - z * se,
        slope_high=slope + z * se,
        tau=tau,
        late_slope=late,
        late_slope_high=late + z * late_se,
        early_slope=sum(d["early_slope"] for d in runs) / len(runs),
        rise_rate=sum(_rise_rate(d, s) for d in runs) / len(runs),
        rate_threshold=tight["threshold_mib"] / tight["window"],
        window=tight["window"],
        threshold_mib=tight["threshold_mib"],
        # Rises in units of each run's own threshold: >= 1 on average means the floor rose.
        rise=sum(d["rise_mib"] / d["threshold_mib"] for d in runs) / len(runs),
        end_rise=sum(d["end_rise_mib"] / d["threshold_mib"] for d in runs) / len(runs),
        safe=all(
            (d["step_ratio"] is None or d["step_ratio"] > s.max_step_ratio)
            and d["drop_mib"] < s.max_drop_ratio * d["threshold_mib"]
            for d in runs
        ),
    )


def _judge(
    m: dict[str, Any], verdicts: list[Verdict], per: str, s: ClassifierSettings
) -> tuple[Verdict, str]:
    """The pooled rules over the pooled numbers, in order; the reason says which held."""
    o = _fmt
    slope, late, rate = m["slope"], m["late_slope"], m["rate_threshold"]
    window = m["window"]
    over = f"{window:.0f} steps" if per == "step" else f"{o(window)} s"
    trend = (
        f"floor slope {o(slope)} MiB/{per} (CI {o(m['slope_low'])}..{o(m['slope_high'])}, "
        f"between-run sd {o(m['tau'])}), {'+' if slope >= 0 else ''}{o(slope * window)} MiB "
        f"over {over}"
    )
    thr = f"threshold {o(m['threshold_mib'])} MiB"
    still_rising = (
        late >= s.leak_late_ratio * max(slope, m["rise_rate"])
        and late >= s.saturation_ratio * m["early_slope"]
    )
    plateaus = verdicts.count(Verdict.PLATEAU)
    if (
        m["slope_low"] > 0
        and slope >= rate
        and still_rising
        and m["safe"]
        and plateaus * 2 < len(verdicts)
    ):
        if len(verdicts) == 2 and any(v is not Verdict.LEAK for v in verdicts):
            return Verdict.INCONCLUSIVE, (
                f"{trend} ({thr}) looks like a leak together, but of two runs only one "
                "convicts alone: two runs cannot tell their spread, a third decides"
            )
        return Verdict.LEAK, f"{trend} ({thr}), still rising at the end ({o(late)} MiB/{per})"
    if m["rise"] >= 1 and m["late_slope_high"] <= s.plateau_late_ratio * m["rise_rate"]:
        return Verdict.PLATEAU, (
            f"the floor rose {o(m['rise'])} x its threshold on average, then stopped: late "
            f"slope {o(late)} MiB/{per}, at most {o(m['late_slope_high'])}; {trend}"
        )
    if m["rise"] >= 1 or m["end_rise"] >= 1:
        return Verdict.INCONCLUSIVE, (
            f"the floor rose {o(max(m['rise'], m['end_rise']))} x its threshold on average, "
            f"neither a leak nor a plateau together; {trend}"
        )
    if m["slope_high"] < rate and Verdict.LEAK not in verdicts and not plateaus:
        return Verdict.CLEAN, f"{trend}; even the upper bound stays under the {thr}"
    return Verdict.INCONCLUSIVE, f"{trend}; too uncertain to call against the {thr}"


def pool_series(
    series: Sequence[tuple[Verdict, dict[str, Any]]], s: ClassifierSettings
) -> PooledSeries:
    """The pooled verdict of one series over >= 2 runs ((run verdict, series dict) pairs)."""
    unit = series[0][1]["unit"]
    m = _numbers([d for _, d in series], s)
    verdict, reason = _judge(m, [v for v, _ in series], "step" if unit == "MiB/step" else "s", s)
    return PooledSeries(
        verdict=verdict,
        reason=reason,
        unit=unit,
        runs=len(series),
        **{k: m[k] for k in PooledSeries.__dataclass_fields__ if k in m},
        growth_mib=m["slope"] * m["window"],
    )


def _has_floors(series: dict[str, Any] | None) -> bool:
    """A series with floors per step to pool as a short run (judged or too short alone)."""
    return (
        series is not None
        and series.get("unit") == "MiB/step"
        and len(series.get("floors_mib") or ()) >= SHORT_MIN
        and len(set(series.get("floor_x") or ())) >= 2
        and (series.get("window") or 0) > 0
        and series.get("threshold_mib") is not None
    )


def _short_runs(runs: Sequence[PooledRun]) -> list[PooledRun]:
    """The runs of the short-run pool: ended normally, with host floors per step."""
    return [
        r
        for r in runs
        if r.ended_normally
        and r.verdict in RUN_VERDICTS
        and r.analysis is not None
        and _has_floors(r.analysis.get("host"))
    ]


def _groups(series: Sequence[dict[str, Any]], late: bool = False) -> list:
    """Each run's (floors, positions), or its last half of them."""
    out = []
    for d in series:
        y, x = np.array(d["floors_mib"], dtype=float), np.array(d["floor_x"], dtype=float)
        if late:
            y, x = y[len(y) // 2 :], x[len(x) // 2 :]
        if len(set(x.tolist())) >= 2:
            out.append((y, x))
    return out


def pool_short(series: Sequence[dict[str, Any]], s: ClassifierSettings) -> PooledSeries:
    """The short-run pool's verdict over >= 2 runs' series dicts, per step (the module
    docstring); the reason names the first LEAK rule that failed."""
    unit = series[0]["unit"]
    fit = grouped_theilslopes(_groups(series), alpha=s.confidence)
    late = grouped_theilslopes(_groups(series, late=True), alpha=s.confidence)
    window = float(np.median([d["window"] for d in series]))
    threshold = float(np.median([d["threshold_mib"] for d in series]))
    own = [theilslopes(y, x)[0] for y, x in _groups(series)]
    o = _fmt
    trend = (
        f"floor slope {o(fit.slope)} MiB/step (CI {o(fit.low_slope)}..{o(fit.high_slope)}) "
        f"within each run, {'+' if fit.slope >= 0 else ''}{o(fit.slope * window)} MiB over "
        f"{window:.0f} steps"
    )
    thr = f"threshold {o(threshold)} MiB"
    rules = [  # rule 3, in order: (holds, why not)
        (len(series) >= 3, "two runs cannot tell their spread, a third decides"),
        (all(x > 0 for x in own),
         "not every run rose on its own (" + ", ".join(o(x) for x in own) + " MiB/step)"),
        (fit.low_slope > 0 and fit.slope * window >= threshold,
         f"too uncertain to call against the {thr}"),
        (late.slope >= s.leak_late_ratio * fit.slope,
         f"the last half of each run rose only {o(late.slope)} MiB/step"),
    ]  # fmt: skip
    failed = [why for holds, why in rules if not holds]
    if not failed:
        verdict, reason = Verdict.LEAK, f"{trend} ({thr}), every run rising to its end"
    elif fit.high_slope * window < threshold:
        verdict, reason = Verdict.CLEAN, f"{trend}; even the upper bound stays under the {thr}"
    else:
        verdict, reason = Verdict.INCONCLUSIVE, f"{trend}; {failed[0]}"
    return PooledSeries(
        verdict=verdict, reason=reason, unit=unit, runs=len(series), slope=fit.slope,
        slope_low=fit.low_slope, slope_high=fit.high_slope, tau=math.nan,
        rate_threshold=threshold / window, window=window, threshold_mib=threshold,
        growth_mib=fit.slope * window, late_slope=late.slope, late_slope_high=late.high_slope,
    )  # fmt: skip


def _pool_short(runs: Sequence[PooledRun], s: ClassifierSettings) -> PooledAnalysis | None:
    """The candidate's verdict from the short-run pool, None when fewer than 2 runs join."""
    short = _short_runs(runs)
    if len(short) < 2:
        return None
    host = pool_short([r.analysis["host"] for r in short], s)  # type: ignore[index]
    gpu_series = [r.analysis["gpu"] for r in short if _has_floors(r.analysis.get("gpu"))]  # type: ignore[union-attr]
    gpu = pool_short(gpu_series, s) if len(gpu_series) >= 2 else None
    has_gpu = any(r.analysis.get("gpu") for r in short)  # type: ignore[union-attr]
    together, reason = _combine(host, gpu, has_gpu)
    others = [r.verdict for r in runs if not any(r is p for p in short)]
    verdict = aggregate([together] * len(short) + others)
    text = (
        f"pooled over {len(short)} runs too short to judge alone: {together.value}: {reason}"
    )
    if others:
        listed = ", ".join(v.value for v in others)
        text += f"; with {len(others)} other runs ({listed}): {verdict.value}"
    return PooledAnalysis(verdict, text, len(short), together, host, gpu)


def _pooled_runs(runs: Sequence[PooledRun], s: ClassifierSettings) -> list[PooledRun]:
    """The runs pooled (rule 1): ended normally with a run verdict and usable host floors."""
    out = [
        r
        for r in runs
        if r.ended_normally
        and r.verdict in RUN_VERDICTS
        and r.analysis is not None
        and _usable(r.analysis.get("host"), s)
    ]
    units = [r.analysis["host"]["unit"] for r in out]  # type: ignore[index]
    return [r for r, u in zip(out, units, strict=True) if u == units[0]] if out else []


def _series_of(runs: Sequence[PooledRun], name: str, s: ClassifierSettings) -> list:
    pairs = [(r.verdict, r.analysis[name]) for r in runs if _usable(r.analysis.get(name), s)]  # type: ignore[union-attr]
    return [p for p in pairs if p[1]["unit"] == pairs[0][1]["unit"]] if pairs else []


def _combine(host: PooledSeries, gpu: PooledSeries | None, has_gpu: bool) -> tuple[Verdict, str]:
    """Host and GPU as `analysis._combine` does; a GPU series too thin to pool is INCONCLUSIVE."""
    if has_gpu and gpu is None:
        return (
            Verdict.INCONCLUSIVE,
            f"gpu: too few runs with GPU floors to pool; host: {host.reason}",
        )
    series = [("host", host)] + ([("gpu", gpu)] if gpu is not None else [])
    for wanted in (Verdict.LEAK, Verdict.INCONCLUSIVE, Verdict.PLATEAU, Verdict.CLEAN):
        first = [(n, a) for n, a in series if a.verdict is wanted]
        if first:
            rest = [(n, a) for n, a in series if a.verdict is not wanted]
            return wanted, "; ".join(f"{n} {a.verdict.value}: {a.reason}" for n, a in first + rest)
    raise AssertionError("unreachable")


def classify_runs(
    runs: Sequence[PooledRun],
    settings: ClassifierSettings = ClassifierSettings(),  # noqa: B008 - frozen, safe to share
) -> PooledAnalysis:
    """A candidate's verdict from all its runs (the rules in the module docstring)."""
    verdicts = [r.verdict for r in runs]
    pooled = _pooled_runs(runs, settings)
    if len(pooled) < 2 and (short := _pool_short(runs, settings)) is not None:
        return short
    if len(pooled) < 2:
        verdict = aggregate(verdicts)
        return PooledAnalysis(
            verdict, f"{verdict.value} by vote of {len(runs)} runs", len(pooled), None, None, None
        )
    host = pool_series(_series_of(pooled, "host", settings), settings)
    gpu_runs = _series_of(pooled, "gpu", settings)
    has_gpu = any(r.analysis.get("gpu") for r in pooled)  # type: ignore[union-attr]
    gpu = pool_series(gpu_runs, settings) if len(gpu_runs) >= 2 else None
    together, reason = _combine(host, gpu, has_gpu)
    others = [r.verdict for r in runs if not any(r is p for p in pooled)]
    verdict = aggregate([together] * len(pooled) + others)
    text = f"pooled over {len(pooled)} runs: {together.value}: {reason}"
    if others:
        listed = ", ".join(v.value for v in others)
        text += f"; with {len(others)} other runs ({listed}): {verdict.value}"
    return PooledAnalysis(verdict, text, len(pooled), together, host, gpu)


def _side(verdict: Verdict) -> str | None:
    return "leak" if verdict.leaks else "bounded" if verdict.bounded else None


def classify_evaluations(
    earlier: Sequence[tuple[Verdict, Sequence[PooledRun]]],
    latest: Sequence[PooledRun],
    settings: ClassifierSettings = ClassifierSettings(),  # noqa: B008 - frozen, safe to share
) -> PooledAnalysis:
    """An evaluation that ended inconclusive (`latest`, its runs) judged with the candidate's
    `earlier` evaluations (each its verdict and its runs): the rules "Across evaluations"
    in the module docstring."""
    runs = [r for _, rs in earlier for r in rs] + list(latest)
    together = classify_runs(runs, settings)
    pooled = _pooled_runs(runs, settings)
    span = (
        f"evaluations 1 and {len(earlier) + 1}"
        if len(earlier) == 1
        else f"evaluations 1 to {len(earlier) + 1}"
    )
    if together.pooled is None:  # fewer than two runs to pool: nothing new to weigh
        return PooledAnalysis(
            Verdict.INCONCLUSIVE, f"too few runs to pool across {span}", together.runs,
            None, None, None,
        )  # fmt: skip
    head = f"pooled over {together.runs} runs across {span}"
    reason = together.reason.split(": ", 1)[1]  # the part after "pooled over N runs"
    sides = {_side(v) for v, _ in earlier if v.decisive}
    agrees = together.verdict.decisive and sides <= {_side(together.verdict)}
    if (
        agrees
        and together.verdict is together.pooled
        and any(r is p for r in latest for p in pooled)
    ):
        return PooledAnalysis(
            together.verdict, f"{head}: {reason}", together.runs, together.pooled,
            together.host, together.gpu,
        )  # fmt: skip
    why = (
        f"; {together.verdict.value} against the earlier {'/'.join(sorted(s for s in sides if s))}"
        " evaluation: kept inconclusive"
        if together.verdict.decisive and not agrees
        else ""
    )
    return PooledAnalysis(
        Verdict.INCONCLUSIVE, f"{head}: {reason}{why}", together.runs, together.pooled,
        together.host, together.gpu,
    )  # fmt: skip
