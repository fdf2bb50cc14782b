"""Pooled evidence (engine/pooled.py) on generated traces, and how the scheduler uses it:
the candidate's verdict, the stored pooled analysis, the report, the longer-run hints."""

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import insert
from sqlmodel import Session, col, select

from engine.analysis import aggregate, classify_run
from engine.pooled import PooledRun, classify_evaluations, classify_runs
from engine.synthetic import SCENARIOS, STEPPED_SCENARIOS, stepped_trace, trace
from engine.verdicts import Verdict
from service.cli.display import render_report
from service.db import make_engine, upgrade
from service.markdown import markdown_report
from service.models import Candidate, Job, MemorySample, Trial, TrialStatus
from service.report import build_report, candidate_rows, evidence
from service.scheduler import advance
from service.specs import longer_run_hints, trial_spec

# N: not decided (inconclusive).
C, N, L, P = Verdict.CLEAN, Verdict.INCONCLUSIVE, Verdict.LEAK, Verdict.PLATEAU


def stepped(scenario: str, seed: int, **params: float) -> PooledRun:
    t, v, marks = stepped_trace(scenario, steps=40, seed=seed, **params)
    run = classify_run(t, v, None, marks, exit_code=0, oom_killed=False, timed_out=False)
    return PooledRun(run.verdict, run.to_dict(), True)


def timed(scenario: str, seed: int, **params: float) -> PooledRun:
    t, v = trace(scenario, seed=seed, **params)
    run = classify_run(t, v, None, exit_code=0, oom_killed=False, timed_out=False)
    return PooledRun(run.verdict, run.to_dict(), True)


# ------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize("base", [151, 406, 754])
def test_three_noisy_clean_runs_are_clean_together(base: int) -> None:
    # 40 steps under 6 MiB of AR(1) noise: each run alone is too uncertain to call.
    runs = [stepped("flat", base + i, noise_mib=6.0) for i in range(3)]
    assert [r.verdict for r in runs] == [N, N, N]
    assert aggregate([r.verdict for r in runs]) is N  # the vote cannot decide
    pooled = classify_runs(runs)
    assert (pooled.verdict, pooled.pooled, pooled.runs) == (C, C, 3)
    assert pooled.reason.startswith("pooled over 3 runs: clean: host clean: floor slope ")
    assert pooled.host is not None and pooled.host.slope_high < pooled.host.rate_threshold


@pytest.mark.parametrize("base", [169, 313, 331])
def test_three_slow_leak_runs_leak_together(base: int) -> None:
    # 1 MiB a step on 500 MiB (threshold 25 MiB over ~37 judged steps) under 6 MiB noise.
    runs = [stepped("leak", base + i, noise_mib=6.0, leak_mib_per_step=1.0) for i in range(3)]
    assert [r.verdict for r in runs] == [N, N, N]
    pooled = classify_runs(runs)
    assert (pooled.verdict, pooled.pooled) == (L, L)
    assert pooled.host is not None and pooled.host.slope_low > 0
    assert pooled.host.growth_mib >= pooled.host.threshold_mib
    assert "still rising at the end" in pooled.reason


def test_one_run_is_judged_exactly_as_before() -> None:
    for run in (stepped("flat", 144, noise_mib=6.0), stepped("leak", 1), stepped("cache", 2)):
        pooled = classify_runs([run])
        assert (pooled.verdict, pooled.pooled, pooled.runs) == (aggregate([run.verdict]), None, 1)
    assert classify_runs([]).verdict is N


def bounded_traces() -> list[tuple[str, object]]:
    """Every bounded scenario of engine.synthetic, made harder than its defaults."""
    out: list[tuple[str, object]] = []
    for name, truth in SCENARIOS.items():
        if truth == "bounded":
            out.append((name, lambda seed, n=name: timed(n, seed, seconds=60, noise_mib=8.0)))
    for name in STEPPED_SCENARIOS:
        if name != "leak":
            out.append((f"stepped {name}", lambda seed, n=name: stepped(n, seed, noise_mib=10.0)))
    return out


@pytest.mark.parametrize(("name", "make"), bounded_traces())
def test_bounded_scenarios_stay_under_one_percent_false_leak(name: str, make) -> None:
    seeds = 100
    leaks = {2: 0, 3: 0}
    for seed in range(seeds):
        runs = [make(10 * seed + i) for i in range(3)]
        for k in leaks:
            leaks[k] += classify_runs(runs[:k]).verdict is L
    assert leaks[2] <= seeds // 100 and leaks[3] <= seeds // 100, (name, leaks)


def test_two_runs_that_disagree_leak_and_clean_stay_inconclusive() -> None:
    runs = [timed("fast_leak", 3, seconds=120), timed("flat", 4, seconds=120)]
    assert [r.verdict for r in runs] == [L, C]
    pooled = classify_runs(runs)
    # The slopes disagree far beyond each run's noise: the between-run term widens the
    # interval past zero, and a LEAK run rules out CLEAN.
    assert pooled.verdict is N
    assert pooled.host is not None and pooled.host.tau > 0 and pooled.host.slope_low <= 0


def test_two_runs_that_disagree_plateau_and_leak_are_not_a_leak() -> None:
    runs = [timed("cache", 5, seconds=120), timed("fast_leak", 6, seconds=120)]
    assert [r.verdict for r in runs] == [P, L]
    # Half the runs are plateaus: pooling may not call that a leak.
    assert classify_runs(runs).verdict is N


def test_two_runs_clean_and_noisy_settle_clean() -> None:
    runs = [stepped("flat", 144, noise_mib=6.0), stepped("flat", 2, noise_mib=6.0)]
    assert [r.verdict for r in runs] == [N, C]
    assert classify_runs(runs).verdict is C


def test_runs_not_ended_normally_keep_their_own_vote() -> None:
    clean = [stepped("flat", 144 + i, noise_mib=6.0) for i in range(3)]
    killed = PooledRun(L, stepped("leak", 7).analysis, ended_normally=False)
    crashed = PooledRun(Verdict.ERROR, None, ended_normally=False)
    # Three runs pooled to CLEAN outvote one killed by the cap; an error does not vote.
    pooled = classify_runs([*clean, killed, crashed])
    assert (pooled.verdict, pooled.pooled, pooled.runs) == (C, C, 3)
    assert pooled.reason.endswith("; with 2 other runs (leak, error): clean")
    # Two pooled runs that are still inconclusive together: the killed run's LEAK is the
    # only decisive vote, as it was before pooling.
    two = classify_runs([*clean[:2], killed])
    assert (two.verdict, two.pooled) == (L, N)
    # One pooled run is too few to pool: the plain vote (inconclusive runs ignored).
    assert classify_runs([clean[0], killed]).verdict is L


def test_the_pooled_analysis_is_plain_json() -> None:
    import json

    d = classify_runs([stepped("flat", 144 + i, noise_mib=6.0) for i in range(3)]).to_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert (d["verdict"], d["pooled"], d["runs"], d["gpu"]) == ("clean", "clean", 3, None)
    assert set(d["host"]) >= {"slope", "slope_low", "slope_high", "tau", "threshold_mib"}


# ------------------------------------------- across evaluations (issue #35, item 3)


def slow_leak(seed: int) -> PooledRun:
    """1 MiB a step on 500 MiB under 6 MiB of noise: one run alone is often undecided."""
    return stepped("leak", seed, noise_mib=6.0, leak_mib_per_step=1.0)


@pytest.mark.parametrize("seed", [312, 316])
def test_a_leak_then_an_inconclusive_evaluation_leak_together(seed: int) -> None:
    # The bad bound: its first evaluation leaked, its re-run's runs were undecided.
    # An inconclusive evaluation contradicts nothing: its runs are more evidence.
    first, *again = [slow_leak(seed + i) for i in range(3)]
    assert (first.verdict, [r.verdict for r in again]) == (L, [N, N])
    assert classify_runs(again).verdict is N  # the re-run alone decides nothing
    across = classify_evaluations([(L, [first])], again)
    assert (across.verdict, across.pooled, across.runs) == (L, L, 3)
    assert across.reason.startswith(
        "pooled over 3 runs across evaluations 1 and 2: leak: host leak: floor slope "
    )


def test_pooling_across_evaluations_can_stay_inconclusive() -> None:
    first, *again = [slow_leak(330 + i) for i in range(3)]
    assert (first.verdict, [r.verdict for r in again]) == (L, [N, N])
    across = classify_evaluations([(L, [first])], again)
    assert (across.verdict, across.runs) == (N, 3)
    assert across.reason.startswith("pooled over 3 runs across evaluations 1 and 2: ")


def test_two_single_runs_do_not_convict_across_evaluations() -> None:
    # Pooled rule "two runs": a leak run and an undecided one are no conviction together.
    first, again = slow_leak(316), slow_leak(317)
    assert (first.verdict, again.verdict) == (L, N)
    across = classify_evaluations([(L, [first])], [again])
    assert across.verdict is N
    assert across.reason.endswith("two runs cannot tell their spread, a third decides")


def test_a_run_cannot_confirm_its_own_evaluation() -> None:
    # Evaluation 1 leaked on a run the cap killed (never pooled: its vote alone); the re-run's
    # two noisy flat runs are undecided. All runs together, that one LEAK still wins the
    # vote, but the pooled evidence says nothing: the evaluation stays inconclusive.
    killed = PooledRun(L, stepped("leak", 7).analysis, ended_normally=False)
    again = [stepped("flat", 144 + i, noise_mib=6.0) for i in range(2)]
    assert [r.verdict for r in again] == [N, N]
    assert classify_runs([killed, *again]).verdict is L
    across = classify_evaluations([(L, [killed])], again)
    assert (across.verdict, across.pooled) == (N, N)
    # With a single run beside it there is nothing to pool at all.
    alone = classify_evaluations([(L, [killed])], again[:1])
    assert (alone.verdict, alone.reason) == (N, "too few runs to pool across evaluations 1 and 2")


def test_pooling_never_turns_opposing_evidence_into_a_verdict() -> None:
    # Evaluation 1: leak (a killed run's vote beside an undecided run); evaluation 2: three
    # undecided flat runs. Together the four flat runs pool to CLEAN, against evaluation 1:
    # kept inconclusive, never a clean that would make the candidate flaky by pooling.
    killed = PooledRun(L, stepped("leak", 7).analysis, ended_normally=False)
    first, *again = [stepped("flat", seed, noise_mib=6.0) for seed in (113, 118, 124, 129)]
    assert [r.verdict for r in (first, *again)] == [N, N, N, N]
    assert classify_runs([killed, first]).verdict is L
    assert classify_runs(again).verdict is N
    across = classify_evaluations([(L, [killed, first])], again)
    assert (across.verdict, across.pooled) == (N, C)
    assert across.reason.endswith("clean against the earlier leak evaluation: kept inconclusive")


@pytest.mark.parametrize("scenario", ["flat", "spikes"])
def test_pooling_across_evaluations_does_not_confirm_false_leaks(scenario: str) -> None:
    # A bounded release whose first run came out LEAK by chance (10 MiB of noise, one run
    # in about 40) and whose re-run of three runs is undecided: pooled, never a leak.
    cases = confirmed = 0
    for seed in range(0, 3000, 3):
        first = stepped(scenario, seed, noise_mib=10.0)
        if first.verdict is not L:
            continue
        again = [stepped(scenario, seed + 100_000 + i, noise_mib=10.0) for i in range(3)]
        if classify_runs(again).verdict is not N:
            continue
        cases += 1
        confirmed += classify_evaluations([(L, [first])], again).verdict is L
    assert cases >= 5 and confirmed == 0, (cases, confirmed)


# --------------------------------------------------------------- longer-run hints


def test_longer_run_hints_double_the_longest_run() -> None:
    assert longer_run_hints([(30.2, 40), (61.0, None), (None, 90)]) == {"LEAKBISECT_SECONDS": "122"}
    assert longer_run_hints([(30.0, 40), (20.0, 90)]) == {
        "LEAKBISECT_SECONDS": "60",
        "LEAKBISECT_STEPS": "80",
    }
    assert longer_run_hints([(None, 40)]) == {}


# ---------------------------------------------------------------- the scheduler


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    url = f"sqlite:///{tmp_path / 'pooled.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        yield session
    engine.dispose()


def seed_job(session: Session, **fields: object) -> Job:
    job = Job(
        package="leakyfixture",
        good="1.0.0",
        bad="1.0.1",
        script="pass",
        script_sha256="abc",
        **fields,  # type: ignore[arg-type]
    )
    session.add(job)
    session.flush()
    for position, version in enumerate(("1.0.0", "1.0.1")):
        session.add(Candidate(job_id=job.id, position=position, version=version))
    session.commit()
    session.refresh(job)
    return job


def queued(session: Session, candidate: Candidate) -> list[Trial]:
    query = select(Trial).where(
        Trial.candidate_id == candidate.id, Trial.status == TrialStatus.QUEUED
    )
    return list(session.exec(query.order_by(col(Trial.id))))


def finish(session: Session, trial: Trial, run: PooledRun, duration: float) -> None:
    """Record `run` as the trial's result, with 40 step markers in its samples."""
    trial.status = TrialStatus.DONE
    trial.verdict = run.verdict.value
    trial.analysis = run.analysis
    trial.exit_code = 0
    trial.duration_s = duration
    session.add(trial)
    rows = [{"trial_id": trial.id, "t": s * 0.5, "rss": 1 << 29, "step": s} for s in range(40)]
    session.execute(insert(MemorySample), rows)
    session.commit()


def test_an_inconclusive_candidate_runs_longer_then_settles_on_the_pooled_verdict(
    session: Session,
) -> None:
    job = seed_job(session, variables={"LEAKBISECT_STEPS": "10", "OTHER": "x"})
    advance(session, job, 1)
    good = session.exec(select(Candidate).where(Candidate.version == "1.0.0")).one()
    runs = [stepped("flat", 144 + i, noise_mib=6.0) for i in range(3)]

    [first] = queued(session, good)
    assert first.hints == {}
    assert trial_spec(job, good, first).variables == {"LEAKBISECT_STEPS": "10", "OTHER": "x"}
    finish(session, first, runs[0], duration=30.2)
    advance(session, job, 1)

    [second] = queued(session, good)
    assert second.hints == {"LEAKBISECT_SECONDS": "61", "LEAKBISECT_STEPS": "80"}
    # The job's own --env wins over the hint.
    assert trial_spec(job, good, second).variables == {
        "LEAKBISECT_SECONDS": "61",
        "LEAKBISECT_STEPS": "10",
        "OTHER": "x",
    }
    finish(session, second, runs[1], duration=50.0)
    advance(session, job, 1)

    # Two runs pooled are still inconclusive: a third, twice the longest so far.
    [third] = queued(session, good)
    assert third.hints == {"LEAKBISECT_SECONDS": "100", "LEAKBISECT_STEPS": "80"}
    finish(session, third, runs[2], duration=40.0)
    advance(session, job, 1)

    session.refresh(good)
    assert (good.verdict, good.evaluations) == ("clean", ["clean"])
    assert good.pooled is not None
    assert (good.pooled["runs"], good.pooled["evaluation"]) == (3, 1)
    assert good.pooled["reason"].startswith("pooled over 3 runs: clean: host clean: ")
    trials = list(session.exec(select(Trial).where(Trial.job_id == job.id)))
    [row] = [r for r in candidate_rows([good], trials, job)]
    assert row.pooled == good.pooled["reason"]
    assert evidence(good, trials).pooled == good.pooled


def test_the_report_shows_the_pooled_line(session: Session) -> None:
    job = seed_job(session)
    job.status = "bounds_failed"
    good, bad = session.exec(select(Candidate).order_by(col(Candidate.position))).all()
    pooled = classify_runs([stepped("flat", 144 + i, noise_mib=6.0) for i in range(3)])
    good.verdict, good.evaluations = "clean", ["clean"]
    good.pooled = {**pooled.to_dict(), "evaluation": 1}
    session.add_all([job, good])
    session.commit()
    report = build_report(job, [good, bad], [])
    assert report.wire()["evidence"][0]["pooled"]["reason"] == pooled.reason
    assert report.wire()["candidates"][0]["pooled"] == pooled.reason
    out = io.StringIO()
    render_report(Console(file=out, width=400, no_color=True), report, {})
    assert f"  {pooled.reason}" in out.getvalue()
    assert f"- 1.0.0: {pooled.reason[:40]}" in markdown_report(report)


@pytest.mark.parametrize(("value", "markers"), [("3", 3), ("zero", 40), ("", 40)])
def test_the_example_repro_honours_leakbisect_steps(
    tmp_path: Path, value: str, markers: int
) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "leakyfixture.py").write_text("def step():\n    pass\n")
    repro = Path(__file__).resolve().parents[1] / "service" / "example" / "repro.py"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LEAKBISECT_STEPS": value}
    out = subprocess.run(
        [sys.executable, str(repro)], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines() == ["::leakbisect-step::"] * markers


def test_two_runs_convict_only_when_both_do_alone() -> None:
    # A 1 MiB/step leak under 6 MiB of noise, runs that lean leak together but that not both
    # call a leak alone: two runs cannot tell their spread, so a third is needed.
    for seed, alone in ((314, [N, N]), (316, [L, N])):
        two = [stepped("leak", seed + i, noise_mib=6.0, leak_mib_per_step=1.0) for i in range(2)]
        assert [r.verdict for r in two] == alone
        pooled = classify_runs(two)
        assert (pooled.verdict, pooled.pooled) == (N, N)
        assert pooled.reason.endswith(
            "looks like a leak together, but of two runs only one convicts alone: two runs "
            "cannot tell their spread, a third decides"
        )
    # Two runs that each leak alone are a leak together.
    strong = [stepped("leak", 1), stepped("leak", 2)]
    assert [r.verdict for r in strong] == [L, L]
    assert classify_runs(strong).verdict is L


# ------------------------------------------------- the scheduler pools across evaluations


def run_round(session: Session, job: Job, candidate: Candidate, run: PooledRun) -> None:
    """Finish the candidate's one queued trial with `run`, then advance the job."""
    [trial] = queued(session, candidate)
    finish(session, trial, run, duration=20.0)
    advance(session, job, 1)


def test_an_inconclusive_confirmation_is_pooled_with_the_first_evaluation(
    session: Session,
) -> None:
    job = seed_job(session, max_runs=2, attribute=False)
    advance(session, job, 1)
    good, bad = session.exec(select(Candidate).order_by(col(Candidate.position))).all()
    clean = stepped("flat", 7)
    first, *again = [slow_leak(312 + i) for i in range(3)]
    run_round(session, job, good, clean)
    run_round(session, job, bad, first)  # leak
    run_round(session, job, good, clean)  # the good bound confirmed
    run_round(session, job, bad, again[0])  # undecided: a second run, to max_runs
    run_round(session, job, bad, again[1])  # undecided too: pooled with evaluation 1
    session.refresh(job)
    session.refresh(bad)
    assert (job.status, bad.evaluations) == ("found", ["leak", "leak"])
    assert job.message is not None and job.message.splitlines()[0] == (
        "first bad is 1.0.1 and last good is 1.0.0, each confirmed by a second evaluation"
    )
    assert bad.pooled is not None
    assert (bad.pooled["runs"], bad.pooled["evaluation"]) == (3, 2)
    reason = bad.pooled["reason"]
    assert reason.startswith("pooled over 3 runs across evaluations 1 and 2: leak: host leak: ")
    trials = list(session.exec(select(Trial).where(Trial.job_id == job.id)))
    assert [(t.candidate_id, t.evaluation, t.verdict) for t in trials] == [
        (good.id, 1, "clean"), (bad.id, 1, "leak"), (good.id, 2, "clean"),
        (bad.id, 2, "inconclusive"), (bad.id, 2, "inconclusive"),
    ]  # fmt: skip
    # The report says the verdict is pooled across evaluations.
    report = build_report(job, [good, bad], trials)
    assert report.wire()["candidates"][1]["pooled"] == reason
    assert f"- 1.0.1: {reason[:60]}" in markdown_report(report)


def test_a_leak_and_a_clean_evaluation_are_still_a_contradiction(session: Session) -> None:
    job = seed_job(session, attribute=False)
    advance(session, job, 1)
    good, bad = session.exec(select(Candidate).order_by(col(Candidate.position))).all()
    run_round(session, job, good, stepped("flat", 7))
    run_round(session, job, bad, stepped("leak", 1))
    run_round(session, job, good, stepped("flat", 8))
    run_round(session, job, bad, stepped("flat", 9))  # clean: decided, nothing to pool
    session.refresh(job)
    session.refresh(bad)
    assert (job.status, bad.evaluations, bad.pooled) == ("inconclusive", ["leak", "clean"], None)
    assert job.message is not None and job.message.splitlines()[0] == (
        "bad bound 1.0.1 is flaky: its evaluations disagree (leak, clean)"
    )
