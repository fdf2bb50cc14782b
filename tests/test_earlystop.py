"""Early stopping (runners/earlystop.py) on traces of known truth, and end to end.

Rates measured on service.synthetic traces are pinned exactly for fixed seeds: the rule
is deterministic, so a change that moves them shows here.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from runners.earlystop import first_stop, max_looks, seen_by_samples, should_stop
from runners.wire import EarlyStop, EnvResult, TrialReport
from service import synthetic
from service.models import Trial, TrialKind, TrialStatus
from service.specs import early_stop, horizon
from service.trials import judge
from tests.test_run_e2e import cli, run_args

MIB = 1024 * 1024
SEEDS = range(20)
BOUNDED = [s for s, truth in synthetic.SCENARIOS.items() if truth == "bounded"]


def _settings(t: np.ndarray, **kw: float) -> EarlyStop:
    return EarlyStop(horizon_s=float(t[-1]), **kw)


def _first_eligible_look(es: EarlyStop, t: np.ndarray) -> float:
    """The first look at which at least min_fraction of the horizon has been sampled."""
    look = es.look_every_s
    while t[np.searchsorted(t, look, side="right") - 1] / es.horizon_s < es.min_fraction:
        look += es.look_every_s
    return look


def test_a_fast_leak_stops_at_the_first_eligible_look() -> None:
    """40 % of the baseline per minute: all 20 seeds stop at the first look past half
    the horizon (65 s of 120); of 30 seeds one needs the next look."""
    at = []
    for seed in SEEDS:
        t, v = synthetic.trace("fast_leak", seconds=120, seed=seed, fast_leak_per_min=0.4)
        es = _settings(t)
        stop = first_stop(t, v, [], None, es)
        assert stop is not None, seed
        assert stop[1].startswith("floor grew at least"), stop
        assert _first_eligible_look(es, t) == 65.0
        at.append(stop[0])
    assert at == [65.0] * len(SEEDS)


def test_leaks_at_the_default_rates_stop_or_run_to_the_end() -> None:
    """A leak is never wrongly stopped (it leaks); how often it stops early is pinned."""
    stopped = {}
    for scenario in ("fast_leak", "leak_spikes"):
        stopped[scenario] = 0
        for seed in SEEDS:
            t, v = synthetic.trace(scenario, seconds=120, seed=seed)
            stopped[scenario] += first_stop(t, v, [], None, _settings(t)) is not None
    assert stopped == {"fast_leak": 20, "leak_spikes": 18}


@pytest.mark.parametrize("scenario", BOUNDED)
def test_bounded_runs_are_never_stopped(scenario: str) -> None:
    """Clean, spiky, sawtooth, cache-filling, late-step and GPU-plateau runs run to the end."""
    for seed in SEEDS:
        t, v = synthetic.trace(scenario, seconds=120, seed=seed)
        assert first_stop(t, v, [], None, _settings(t)) is None, (scenario, seed)


@pytest.mark.parametrize("cache_end", [0.3, 0.45, 0.5])
def test_a_cache_that_fills_then_stops_is_never_stopped(cache_end: float) -> None:
    """Even when the fill ends right at the first eligible look (half the horizon)."""
    for seed in SEEDS:
        t, v = synthetic.trace("cache", seconds=120, seed=seed, cache_end=cache_end)
        assert first_stop(t, v, [], None, _settings(t)) is None, (cache_end, seed)


@pytest.mark.parametrize("scenario", synthetic.STEPPED_SCENARIOS)
def test_stepped_runs_stop_only_when_they_leak(scenario: str) -> None:
    """With step markers the horizon counts steps; the cache fills over the first half."""
    stops = 0
    for seed in SEEDS:
        t, v, marks = synthetic.stepped_trace(scenario, steps=400, seed=seed)
        es = EarlyStop(horizon_s=float(t[-1]), horizon_steps=400, look_every_s=2.0)
        stops += first_stop(t, v, marks, None, es) is not None
    assert stops == (len(SEEDS) if scenario == "leak" else 0)


def test_without_a_horizon_only_the_cap_stops() -> None:
    t, v = synthetic.trace("fast_leak", seconds=120, seed=0)
    assert first_stop(t, v, [], None, EarlyStop()) is None
    limit = int(v.max() / 0.95)  # the leak reaches 95 % of this cap by its end
    stop = first_stop(t, v, [], limit, EarlyStop())
    assert stop is not None
    assert stop[1].startswith("the memory cap is near: memory at ")
    assert float(v[t <= stop[0]][-1]) >= 0.9 * limit


def test_a_flat_run_near_its_cap_is_not_stopped() -> None:
    """Near the cap but not rising: the classifier would not call an OOM kill a leak."""
    t, v = synthetic.trace("flat", seconds=60, seed=1)
    assert should_stop(t, v, [], int(v.max() / 0.97), EarlyStop()) is None


def test_looks_are_bonferroni_corrected() -> None:
    es = EarlyStop(horizon_s=120.0, look_every_s=5.0)
    assert max_looks(es) == 13  # 60 s of eligible looks every 5 s, plus one
    t, v = synthetic.trace("fast_leak", seconds=120, seed=0)
    stop = first_stop(t, v, [], None, EarlyStop(horizon_s=120.0, look_every_s=5.0))
    assert stop is not None and "at 99.62% confidence" in stop[1]  # 1 - 0.05 / 13


def test_a_live_look_sees_only_the_markers_its_samples_reach() -> None:
    marks = [(0.05, 1), (0.10, 2), (0.15, 3)]
    # Marker 3 landed after the newest sample (which carries step 2): the look waits for it.
    assert seen_by_samples(marks, 2) == [(0.05, 1), (0.10, 2)]
    assert seen_by_samples(marks, 3) == marks
    # No sample yet, or none after the first marker: no step is judged.
    assert seen_by_samples(marks, None) == []
    assert seen_by_samples(marks, 0) == []
    # Numbered markers may repeat a number: up to its latest occurrence.
    assert seen_by_samples([(1.0, 5), (2.0, 6), (3.0, 5), (4.0, 7)], 5) == [
        (1.0, 5), (2.0, 6), (3.0, 5)
    ]  # fmt: skip


def _trial(**kw: object) -> Trial:
    base = dict(kind=TrialKind.RUN, status=TrialStatus.DONE, exit_code=0, timed_out=False,
                duration_s=10.0, analysis={"stopped_early": None, "step_count": 40})  # fmt: skip
    return Trial(job_id=1, candidate_id=1, **{**base, **kw})


def test_the_horizon_is_the_longest_trial_that_ran_to_its_end() -> None:
    assert horizon([]) == (None, None)
    trials = [
        _trial(duration_s=12.0),
        _trial(duration_s=30.0, analysis={"stopped_early": "floor grew", "step_count": 90}),
        _trial(duration_s=40.0, exit_code=1),
        _trial(duration_s=50.0, timed_out=True),
        _trial(duration_s=60.0, status=TrialStatus.LEASED),
        _trial(duration_s=70.0, kind=TrialKind.RESOLVE),
        _trial(duration_s=11.0, analysis={"stopped_early": None, "step_count": 44}),
    ]
    assert horizon(trials) == (12.0, 44)


def test_the_job_option_turns_it_off_and_thresholds_follow_the_job() -> None:
    job = SimpleNamespace(early_stop=True, classifier={"min_growth_mib": 20.0})
    es = early_stop(job, [_trial(duration_s=40.0)])  # type: ignore[arg-type]
    assert es is not None
    assert (es.horizon_s, es.horizon_steps, es.min_growth_mib, es.look_every_s) == (
        40.0, 40, 20.0, 2.0
    )  # fmt: skip
    off = SimpleNamespace(early_stop=False, classifier={})
    assert early_stop(off, []) is None  # type: ignore[arg-type]


def test_a_stopped_early_report_is_judged_a_leak_with_its_reason() -> None:
    t, v = synthetic.trace("fast_leak", seconds=65, seed=0)
    report = TrialReport.model_validate({
        "trial_id": 1, "env": EnvResult(ok=True).model_dump(), "exit_code": -15,
        "samples": [{"t": float(a), "rss": int(b)} for a, b in zip(t, v, strict=True)],
        "stopped_early": "floor grew at least 99 MiB",
    })  # fmt: skip
    job = SimpleNamespace(classifier={})
    verdict, analysis = judge(job, report)  # type: ignore[arg-type]
    assert verdict.value == "leak"
    assert analysis["reason"] == "stopped early: floor grew at least 99 MiB"
    assert analysis["stopped_early"] == "floor grew at least 99 MiB"


def test_end_to_end_the_leaking_bound_stops_early_with_the_same_answer(
    fixture_index: str, uv_cache: Path, reachable_tmp: Path
) -> None:
    """The bundled fixture: 1.0.5 runs to its end first (--jobs 1), giving the horizon;
    1.0.6 leaks and is stopped early; --no-early-stop finds the same pair."""
    answers = {}
    for mode in ("on", "off"):
        extra = ("--no-early-stop",) if mode == "off" else ()
        db = reachable_tmp / f"{mode}.db"
        proc = cli(run_args("1.0.5..1.0.6", fixture_index, db, "--no-reuse", *extra),
                   reachable_tmp, uv_cache)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        runs = {e["version"]: e["runs"] for e in report["evidence"]}
        answers[mode] = (report["last_good"], report["first_bad"])
        assert all(r["stopped_early"] is None for r in runs["1.0.5"])
        if mode == "on":
            assert [r["verdict"] for r in runs["1.0.6"]] == ["leak", "leak"]
            for r in runs["1.0.6"]:
                assert r["stopped_early"].startswith("floor grew at least"), r
                assert r["analysis"]["reason"] == f"stopped early: {r['stopped_early']}"
        else:
            assert all(r["stopped_early"] is None for r in runs["1.0.6"])
    assert answers == {"on": ("1.0.5", "1.0.6"), "off": ("1.0.5", "1.0.6")}
