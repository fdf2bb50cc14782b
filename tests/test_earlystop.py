"""Early stopping (contract/earlystop.py): every rule on generated traces, live, and end to end.

The rule is deterministic, so counts over fixed seeds are pinned exactly: a change that
moves them shows here. The realistic corpus's counts are in tests/test_synthetic_corpus.py.
"""

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from contract.earlystop import (
    MIN_HORIZON_S,
    EarlyStopper,
    first_stop,
    max_looks,
    replay,
    seen_by_samples,
)
from contract.floors import steps_done
from contract.wire import EarlyStop, EarlyStopRecord, EnvResult, TrialReport, TrialSpec
from engine import synthetic
from engine.analysis import classify_series
from engine.verdicts import Verdict
from runners.executor import run_script
from runners.trial import _report
from service.models import Trial, TrialKind, TrialStatus
from service.specs import early_stop, horizon, look_every
from service.trials import judge
from tests.test_run_e2e import cli, run_args

MIB = 1024 * 1024
SEEDS = range(20)
BOUNDED = [s for s, truth in synthetic.SCENARIOS.items() if truth == "bounded"]


def _horizon(t: np.ndarray, steps: int | None, **kw: float) -> EarlyStop:
    """What the service sends once a run like this one went to its end."""
    h = float(t[-1])
    return EarlyStop(horizon_s=h, horizon_steps=steps, look_every_s=look_every(h), **kw)


# ------------------------------------------------------------------ leaks with markers


def test_a_fast_stepped_leak_stops_at_the_first_look_with_half_its_steps() -> None:
    """400 steps of 0.2 s (an 81 s horizon): every seed stops at the first look whose newest
    sample comes after the 200th marker, with one leak look tested."""
    for seed in SEEDS:
        t, v, marks = synthetic.stepped_trace("leak", steps=400, step_s=0.2, seed=seed)
        es = _horizon(t, 400)
        r = replay(t, v, marks, None, es)
        half = next(mt for mt, step in marks if step == 199)
        first = es.look_every_s
        while t[np.searchsorted(t, first, side="right") - 1] < half:
            first += es.look_every_s
        assert (r.at, r.looks) == (first, 1), seed
        assert r.reason is not None and r.reason.startswith("floor grew at least"), r.reason
        assert " steps at 99.55% confidence" in r.reason  # m = 11: 1 - 0.05 / 11


@pytest.mark.parametrize("scenario", synthetic.STEPPED_SCENARIOS)
def test_stepped_runs_stop_only_when_they_leak(scenario: str) -> None:
    """Flat, spiky and cache-filling loops run to their end having tested 9 or 10 looks."""
    stops, looks = 0, []
    for seed in SEEDS:
        t, v, marks = synthetic.stepped_trace(scenario, steps=400, step_s=0.2, seed=seed)
        r = replay(t, v, marks, None, _horizon(t, 400))
        stops += r.at is not None
        looks.append(r.looks)
    if scenario == "leak":
        assert (stops, set(looks)) == (20, {1})
    else:
        assert (stops, sorted(set(looks))) == (0, [9, 10])


# --------------------------------------------------------------------- the marker rule


def _long_import(seed: int, slow: float = 1.0):
    """A leaking loop behind a 300 MiB import of 40 s: half a minute of set-up at least."""
    return synthetic.corpus_stepped(
        "ramp_fast_leak", steps=100, seed=seed, slow=slow, import_s=40.0, import_mib=300.0
    )


def test_no_leak_look_before_the_first_marker() -> None:
    """Even told to look from the first step on, the rule tests nothing during the set-up;
    judged by seconds that set-up is a leak."""
    t, v, marks = _long_import(0)
    es = _horizon(t, 100, min_fraction=0.01)
    first = marks[0][0]
    stopper = EarlyStopper(es)
    for look in np.arange(es.look_every_s, first, es.look_every_s):
        k = int(np.searchsorted(t, look, side="right"))
        assert stopper.look(t[:k], v[:k], [], None) is None
        assert stopper.looks == 0
    before = t < first
    assert classify_series(t[before], v[before]).verdict is Verdict.LEAK
    r = replay(t, v, marks, None, EarlyStopper(es))
    assert r.at is not None and r.at > first + 6  # at least min_blocks judged steps


def test_a_run_with_markers_is_never_judged_by_seconds() -> None:
    """The job's runs print markers: a run that prints none (yet), or too few judged steps,
    is not looked at, however much its samples grow."""
    t, v = synthetic.trace("fast_leak", seconds=120, seed=0, fast_leak_per_min=0.4)
    es = EarlyStop(horizon_s=120.0, horizon_steps=100, look_every_s=5.0)
    r = replay(t, v, [], None, es)
    assert (r.at, r.looks) == (None, 0)
    # Half the horizon's steps printed, but markers every 20 steps leave 3 judged steps.
    sparse = [(10.0 + 0.5 * s, s) for s in range(0, 60, 20)] + [(41.0, 60)]
    stopper = EarlyStopper(es)
    assert stopper.look(t[t < 42], v[t < 42], sparse, None) is None
    assert stopper.looks == 0


def test_a_run_without_markers_is_never_stopped_for_a_leak() -> None:
    """No job run printed markers: only the cap rule can stop (rule 2); the fast leak that
    the rule stopped at 65 s of 120 before issue #23 now runs to its end."""
    for scenario in ("fast_leak", "leak_spikes", *BOUNDED):
        t, v = synthetic.trace(scenario, seconds=120, seed=0)
        r = replay(t, v, [], None, _horizon(t, None))
        assert (r.at, r.looks) == (None, 0), scenario


# ------------------------------------------------------------------ the horizon rule


def test_no_leak_look_under_the_minimum_horizon() -> None:
    """The same leaking run stops under a horizon of MIN_HORIZON_S, and is not looked at
    under one a tenth of a second shorter."""
    assert MIN_HORIZON_S == 60.0
    t, v, marks = synthetic.stepped_trace("leak", steps=400, step_s=0.2, seed=0)
    at = {}
    for h in (MIN_HORIZON_S - 0.1, MIN_HORIZON_S):
        es = EarlyStop(horizon_s=h, horizon_steps=400, look_every_s=look_every(h))
        r = replay(t, v, marks, None, es)
        at[h] = (r.at is not None, r.looks)
    assert at == {MIN_HORIZON_S - 0.1: (False, 0), MIN_HORIZON_S: (True, 1)}


def test_the_cap_rule_stops_at_any_horizon_but_never_on_the_set_up() -> None:
    # A short horizon (the 2 s fixture's) and a leak filling the cap: the cap rule stops it.
    t, v, marks = synthetic.stepped_trace("leak", steps=400, step_s=0.2, seed=0)
    limit = int(v.max() / 0.95)
    es = EarlyStop(horizon_s=2.0, horizon_steps=40, look_every_s=0.1)
    r = replay(t, v, marks, limit, es)
    assert r.reason is not None and r.reason.startswith("the memory cap is near: memory at ")
    assert r.looks == 0
    # An import that fills 95 % of the cap before the first marker: nothing to judge yet.
    t, v, marks = _long_import(1)
    before = t < marks[0][0]
    limit = int(v[before].max() / 0.95)
    assert replay(t[before], v[before], [], limit, es).at is None
    # Without a horizon (no run has ended) the whole run is judged by seconds.
    t, v = synthetic.trace("fast_leak", seconds=120, seed=0)
    assert first_stop(t, v, [], None, EarlyStop()) is None
    limit = int(v.max() / 0.95)
    stop = first_stop(t, v, [], limit, EarlyStop())
    assert stop is not None and stop[1].startswith("the memory cap is near: memory at ")
    assert float(v[t <= stop[0]][-1]) >= 0.9 * limit


def test_a_flat_run_near_its_cap_is_not_stopped() -> None:
    """Near the cap but not rising: the classifier would not call an OOM kill a leak."""
    t, v = synthetic.trace("flat", seconds=60, seed=1)
    assert EarlyStopper(EarlyStop()).look(t, v, [], int(v.max() / 0.97)) is None


# -------------------------------------------------------------------- the look count


def test_the_looks_taken_are_counted_and_never_exceed_the_budget() -> None:
    """A horizon of 108 s (100 steps) allows m = 12 leak looks at 1 - 0.05 / 12. At its pace
    a clean run tests 10; slowed 1.5x, 2x or 3x it has more chances and tests exactly 12,
    then none: each at the same level, so the looks together stay within 5 %."""
    t, _, _ = synthetic.corpus_stepped("import_ramp", steps=100, seed=7)
    es = _horizon(t, 100)
    assert (round(es.horizon_s, 1), es.look_every_s, max_looks(es)) == (107.9, 5.0, 12)
    assert EarlyStopper(es).level == pytest.approx(1 - 0.05 / 12)
    looks = {}
    for slow in (1.0, 1.5, 2.0, 3.0):
        t, v, marks = synthetic.corpus_stepped("import_ramp", steps=100, seed=3, slow=slow)
        r = replay(t, v, marks, None, EarlyStopper(es))
        assert r.at is None
        looks[slow] = r.looks
    assert looks == {1.0: 10, 1.5: 12, 2.0: 12, 3.0: 12}
    # A leak: at its pace the 4th look stops it, slowed 2x the 2nd, slowed 3x the 1st (the
    # floors leave out the excursions: with them, the budget was spent first and it ran to
    # its end).
    got = {}
    for slow in (1.0, 2.0, 3.0):
        t, v, marks = synthetic.corpus_stepped("ramp_fast_leak", steps=100, seed=3, slow=slow)
        r = replay(t, v, marks, None, EarlyStopper(es))
        got[slow] = (r.at, r.looks)
        if r.reason is not None:
            assert " at 99.58% confidence " in r.reason
    assert got == {1.0: (75.0, 4), 2.0: (125.0, 2), 3.0: (175.0, 1)}
    # A stopper whose budget is spent tests nothing more: the samples of the look that
    # stopped the idle run above stop a fresh stopper, not a spent one.
    t, v, marks = synthetic.corpus_stepped("ramp_fast_leak", steps=100, seed=3)
    seen = t <= 75.0
    marks = [m for m in marks if m[0] <= t[seen][-1]]
    spent = EarlyStopper(es, looks=12)
    assert spent.look(t[seen], v[seen], marks, None) is None and spent.looks == 12
    fresh = EarlyStopper(es)
    assert fresh.look(t[seen], v[seen], marks, None) is not None and fresh.looks == 1


# --------------------------------------------------------------------- the orbax case


@pytest.mark.parametrize("slow", [1.0, 2.0])
def test_the_orbax_case_is_not_stopped_on_its_import(slow: float) -> None:
    """The lead's evidence: a first run of 40 steps went to its end in 4.5 s (the horizon);
    the second imports 110-250 MiB over 2.5 s before its first marker. Before issue #23 the
    rule stopped it during the import by seconds. Now: never, idle or slowed 2x, by the
    short-horizon rule and, with that rule off, by the marker rule alone."""
    es = EarlyStop(horizon_s=4.5, horizon_steps=40, look_every_s=look_every(4.5))
    for seed in range(10):
        mib = float(np.random.default_rng(seed).uniform(110, 250))
        t, v, marks = synthetic.corpus_stepped(
            "import_ramp", steps=40, step_s=0.05, hz=50, seed=seed, slow=slow,
            import_s=2.5, import_mib=mib, interp_mib=20.0,
        )  # fmt: skip
        assert marks[0][0] == pytest.approx(2.5 * slow)
        r = replay(t, v, marks, None, EarlyStopper(es))
        assert (r.at, r.looks) == (None, 0)
        markers_only = EarlyStopper(es, min_horizon_s=0.0)
        r = replay(t, v, marks, None, markers_only)
        assert r.at is None, (seed, r.reason)
        # What the old rule judged at its stop: the import by seconds, a leak.
        k = int(np.searchsorted(t, 2.4 * slow))
        assert classify_series(t[:k], v[:k]).verdict is Verdict.LEAK, seed


# ---------------------------------------------------------------- the live looks


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


LIVE_REPRO = """\
import os, time
keep = []
time.sleep(0.5)  # set-up
for step in range(int(os.environ.get("STEPS", "150"))):
    print(f"::leakbisect-step:: {step}", flush=True)
    keep.append(bytearray(4 * 1024 * 1024))  # 4 MiB a step, touched
    time.sleep(0.03)
"""


def test_a_live_run_reports_its_looks_and_the_service_stores_them(
    trial_dir: Path, trial_python: str
) -> None:
    """A real child process under the local executor: the horizon says 150 steps and 60 s,
    the script leaks 4 MiB a step. It is stopped once half its steps are printed, the
    record carries the horizon and the looks tested, and the report and the stored
    analysis carry the record."""
    script = trial_dir / "repro.py"
    script.write_text(textwrap.dedent(LIVE_REPRO))
    es = EarlyStop(horizon_s=60.0, horizon_steps=150, look_every_s=0.25)
    ex = run_script(trial_python, script, cwd=trial_dir, timeout_s=60,
                    memory_limit_bytes=2048 * MIB, early_stop=es)  # fmt: skip
    assert ex.stopped_early is not None and ex.stopped_early.startswith("floor grew"), ex
    assert ex.early_stop is not None
    assert (ex.early_stop.horizon_s, ex.early_stop.horizon_steps) == (60.0, 150)
    assert 1 <= ex.early_stop.looks <= max_looks(es)
    # Half the horizon's steps done (markers 0..74 are 75 steps), never all of them.
    assert 75 <= steps_done(ex.steps) < 150
    spec = TrialSpec.model_validate(
        {"trial_id": 7, "env": {"package": "x", "version": "1"}, "script": LIVE_REPRO,
         "early_stop": es.model_dump()}
    )  # fmt: skip
    report = _report(spec, EnvResult(ok=True), ex)
    assert report.early_stop == ex.early_stop
    verdict, analysis = judge(SimpleNamespace(classifier={}), report)  # type: ignore[arg-type]
    assert verdict is Verdict.LEAK
    assert analysis["early_stop"] == ex.early_stop.model_dump()
    # Without early-stop settings a run goes to its end and records nothing.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(trial_dir), "STEPS": "5"}
    ex = run_script(trial_python, script, cwd=trial_dir, timeout_s=60,
                    memory_limit_bytes=2048 * MIB, env=env)  # fmt: skip
    assert (ex.exit_code, ex.stopped_early, ex.early_stop) == (0, None, None)
    assert judge(SimpleNamespace(classifier={}),  # type: ignore[arg-type]
                 _report(spec, EnvResult(ok=True), ex))[1]["early_stop"] is None  # fmt: skip


# ------------------------------------------------------------------- the service side


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


def test_a_stopped_early_report_is_judged_a_leak_with_its_reason_and_record() -> None:
    t, v = synthetic.trace("fast_leak", seconds=65, seed=0)
    record = EarlyStopRecord(horizon_s=120.0, horizon_steps=400, looks=3)
    report = TrialReport.model_validate({
        "trial_id": 1, "env": EnvResult(ok=True).model_dump(), "exit_code": -15,
        "samples": [{"t": float(a), "rss": int(b)} for a, b in zip(t, v, strict=True)],
        "stopped_early": "floor grew at least 99 MiB", "early_stop": record.model_dump(),
    })  # fmt: skip
    job = SimpleNamespace(classifier={})
    verdict, analysis = judge(job, report)  # type: ignore[arg-type]
    assert verdict.value == "leak"
    assert analysis["reason"] == "stopped early: floor grew at least 99 MiB"
    assert analysis["stopped_early"] == "floor grew at least 99 MiB"
    assert analysis["early_stop"] == {"horizon_s": 120.0, "horizon_steps": 400, "looks": 3}
    no_settings = report.model_copy(update={"early_stop": None, "stopped_early": None})
    assert judge(job, no_settings)[1]["early_stop"] is None  # type: ignore[arg-type]


def test_end_to_end_the_fixture_runs_to_its_end_with_the_same_answer(
    fixture_index: str, uv_cache: Path, reachable_tmp: Path
) -> None:
    """The bundled fixture's horizon (its good bound's first run, about 2 s) is under
    MIN_HORIZON_S: its leaking bound is no longer stopped early (before issue #23 both its
    runs were), the answer is the same, and every run records the horizon it was sent and
    no leak look (the record of a run without early-stop settings, --no-early-stop, is
    None: test_a_live_run_reports_its_looks_and_the_service_stores_them)."""
    db = reachable_tmp / "on.db"
    proc = cli(run_args("1.0.5..1.0.6", fixture_index, db, "--no-reuse"), reachable_tmp, uv_cache)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    runs = {e["version"]: e["runs"] for e in report["evidence"]}
    assert [r["verdict"] for r in runs["1.0.6"]] == ["leak", "leak"]
    records = []
    for r in runs["1.0.5"] + runs["1.0.6"]:
        assert r["stopped_early"] is None and r["exit_code"] == 0, r
        record = r["analysis"]["early_stop"]
        assert record["looks"] == 0, record
        if record["horizon_s"] is not None:  # the good bound's first run had none yet
            assert 0 < record["horizon_s"] < MIN_HORIZON_S
            assert record["horizon_steps"] == 40
            records.append(record)
    assert len(records) >= 3
