"""The scheduler's service-side duties: job locking, slots, and verdict reuse (SQLite, Postgres)."""

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from contract.wire import Cause, CommitRange, EnvResult, EnvSpec, Failure, TrialReport, TrialSpec
from engine.verdicts import Verdict
from runners import commits
from service import queue, reuse
from service.db import make_engine, upgrade
from service.maintenance import tick
from service.models import (
    Candidate,
    Job,
    JobStatus,
    Runner,
    Trial,
    TrialKind,
    TrialStatus,
    utcnow,
)
from service.queue import cancel_open_trials
from service.report import build_report
from service.scheduler import advance, cancel, slots_for
from service.schemas import InfrastructureStop
from service.settings import Settings
from service.specs import trial_spec
from service.trials import record_report

VERSIONS = [f"1.0.{i}" for i in range(10)]


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'scheduler.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("pg_url")
        upgrade(url)
    engine = make_engine(url)
    if request.param == "postgres":
        with engine.begin() as conn:
            conn.execute(
                text(
                    "TRUNCATE memory_sample, trial, candidate, job, runner RESTART IDENTITY CASCADE"
                )
            )
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with Session(engine) as session:
        yield session


def seed(session: Session, **fields: Any) -> Job:
    values: dict[str, Any] = {
        "package": "leakyfixture",
        "good": VERSIONS[0],
        "bad": VERSIONS[-1],
        "script": "pass",
        "script_sha256": "abc",
        "constraints": ["leakyfixture==1.0.0", "numpy==2.0.0"],
        **fields,
    }
    job = Job(**values)
    session.add(job)
    session.flush()
    for position, version in enumerate(VERSIONS):
        session.add(
            Candidate(
                job_id=job.id, position=position, version=version, testable=version != "1.0.4"
            )
        )
    session.commit()
    session.refresh(job)
    return job


def candidates(session: Session, job: Job) -> list[Candidate]:
    query = select(Candidate).where(Candidate.job_id == job.id).order_by(col(Candidate.position))
    return list(session.exec(query.execution_options(populate_existing=True)))


def queued_versions(session: Session, job: Job) -> list[str]:
    query = (
        select(Candidate.version)
        .join(Trial, col(Trial.candidate_id) == Candidate.id)
        .where(Trial.job_id == job.id, Trial.status == TrialStatus.QUEUED)
        .order_by(col(Trial.id))
    )
    return list(session.exec(query))


def judge(session: Session, job: Job, leaks_from: str = "1.0.6") -> None:
    """Finish every open trial of `job` as the fixture's ground truth says, then advance
    (a commits trial is left to `listed`: its answer is a list, not a verdict)."""
    while True:
        query = select(Trial).where(
            Trial.job_id == job.id,
            Trial.status == TrialStatus.QUEUED,
            Trial.kind != TrialKind.COMMITS,
        )
        open_trials = list(session.exec(query))
        if not open_trials:
            return
        for trial in open_trials:
            candidate = session.get(Candidate, trial.candidate_id)
            assert candidate is not None
            leaks = tuple(map(int, candidate.version.split("."))) >= tuple(
                map(int, leaks_from.split("."))
            )
            trial.status = TrialStatus.DONE
            trial.verdict = Verdict.LEAK if leaks else Verdict.CLEAN
            trial.analysis = {"growth_mib": 40.0 if leaks else 0.5}
            session.add(trial)
        session.commit()
        advance(session, job, 1)


# ----------------------------------------------------------------------------- keys


def key(session: Session, **fields: Any) -> str:
    job = seed(session, **fields)
    return reuse.reuse_key(job, candidates(session, job)[6])


def test_reuse_key_covers_what_decides_a_verdict(session: Session) -> None:
    base = key(session)
    assert key(session) == base
    # Same conditions written differently: the same key.
    assert key(session, min_growth_mib=8.0) == base  # the default, explicit
    assert key(session, constraints=["numpy==2.0.0", "leakyfixture==1.0.2"]) == base  # own pin
    assert key(session, requirements=["b", "a"]) == key(session, requirements=["a", "b"])
    assert key(session, max_runs=5) == base  # only used to settle an inconclusive verdict
    # How strong a verdict is, not what it is: reuse checks the source's (service/reuse.py 3).
    assert key(session, repeats=3) == base
    assert key(session, early_stop=False) == base
    # Anything that can change the verdict: a different key.
    for change in [
        {"script_sha256": "def"},
        {"python": "3.12"},
        {"requirements": ["torch==2.3"]},
        {"index_url": "http://other/simple"},
        {"extra_index_urls": ["http://extra/simple"]},
        {"constraints": ["numpy==1.26.4"]},
        {"as_released": True},
        {"pre": True},
        {"min_growth_mib": 4.0},
        {"hardware_class": "gpu"},
        {"requires_gpu": True},
        {"timeout_s": 60.0},
        {"memory_limit": 1 << 30},
        {"variables": {"LEAK": "1"}},
        {"script_name": "json.py"},
    ]:
        assert key(session, **change) != base, change
    job = seed(session)
    rows = candidates(session, job)
    assert reuse.reuse_key(job, rows[5]) != reuse.reuse_key(job, rows[6])


# ---------------------------------------------------------------------------- reuse


def test_keys_are_computed_lazily_and_reuse_needs_an_earlier_judged_job(session: Session) -> None:
    first = seed(session)
    assert all(c.reuse_key is None for c in candidates(session, first))
    advance(session, first, 1)
    assert all(c.reuse_key for c in candidates(session, first))
    judge(session, first)
    assert first.status == JobStatus.FOUND

    second = seed(session)
    plan = advance(session, second, 1)
    # Each verdict is copied as one evaluation: the boundary pair is confirmed by runs of
    # the job's own (service/reuse.py rule 4), the good one first.
    assert plan.outcome is None and queued_versions(session, second) == ["1.0.5"]
    rows = {c.version: c for c in candidates(session, second)}
    sources = {c.version: c for c in candidates(session, first)}
    assert rows["1.0.5"].evaluations == ["clean"]
    assert rows["1.0.6"].reused_from == sources["1.0.6"].id
    assert rows["1.0.6"].growth_mib == 40.0
    assert rows["1.0.2"].reused_from is None and rows["1.0.2"].evaluations == []
    judge(session, second)
    assert second.status == JobStatus.FOUND
    rows = {c.version: c for c in candidates(session, second)}
    assert (rows["1.0.5"].evaluations, rows["1.0.6"].evaluations) == (
        ["clean", "clean"], ["leak", "leak"]
    )  # fmt: skip
    assert second.message is not None
    assert second.message.splitlines() == [
        "first bad is 1.0.6 and last good is 1.0.5, each confirmed by a second evaluation",
        # The attribution is copied too (`judge` wrote no profiles): not traced again.
        "memray: the traced run wrote no profile; tracemalloc: the traced run wrote no profile"
        f" (reused from job {first.id})",
        f"verdicts of 1.0.0, 1.0.5, 1.0.6, 1.0.7, 1.0.9 reused from job {first.id}",
    ]
    ran = session.exec(
        select(Candidate.version, Trial.kind, Trial.evaluation)
        .join(Trial, col(Trial.candidate_id) == Candidate.id)
        .where(Trial.job_id == second.id)
        .order_by(col(Trial.id))
    ).all()
    assert ran == [("1.0.5", "run", 2), ("1.0.6", "run", 2)]


def test_a_later_job_is_never_a_source(session: Session) -> None:
    older = seed(session)
    newer = seed(session)
    advance(session, newer, 1)
    judge(session, newer)
    advance(session, older, 1)
    assert older.status == JobStatus.RUNNING
    assert queued_versions(session, older) == ["1.0.0"]


def test_errors_and_inconclusive_verdicts_are_not_reused(session: Session) -> None:
    first = seed(session)
    advance(session, first, 1)
    (trial,) = session.exec(select(Trial).where(Trial.job_id == first.id)).all()
    trial.status, trial.verdict = TrialStatus.DONE, Verdict.ERROR
    session.add(trial)
    session.commit()
    advance(session, first, 1)
    assert first.status == JobStatus.ERROR

    second = seed(session)
    advance(session, second, 1)
    assert queued_versions(session, second) == ["1.0.0"]
    assert all(c.reused_from is None for c in candidates(session, second))


def test_reuse_verdicts_false_runs_everything_but_still_serves_later_jobs(
    session: Session,
) -> None:
    first = seed(session)
    advance(session, first, 1)
    judge(session, first)
    private = seed(session, reuse_verdicts=False)
    advance(session, private, 1)
    assert queued_versions(session, private) == ["1.0.0"]
    judge(session, private)
    later = seed(session)
    advance(session, later, 1)
    rows = {c.version: c for c in candidates(session, later)}
    # The source with the most evaluations, then the newest: the private job's.
    source = session.get(Candidate, rows["1.0.5"].reused_from)
    assert source is not None and source.job_id == private.id


# ----------------------------------------------------------------------- concurrency


def test_concurrent_advances_queue_each_pick_once(engine: Engine, session: Session) -> None:
    job = seed(session)
    # Keys first: writing them would serialize the first advances by itself.
    reuse.ensure_keys(session, job, candidates(session, job))
    session.commit()
    job_id = job.id  # read here: the main session is not for other threads
    barrier = threading.Barrier(8, timeout=30)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with Session(engine) as own:
                mine = own.get(Job, job_id)
                assert mine is not None
                barrier.wait()
                advance(own, mine, 2)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert queued_versions(session, job) == ["1.0.0", "1.0.9"]
    assert numbers(session, job) == [("1.0.0", 1), ("1.0.9", 2)]


def numbers(session: Session, job: Job) -> list[tuple[str, int]]:
    query = (
        select(Candidate.version, Trial.number)
        .join(Trial, col(Trial.candidate_id) == Candidate.id)
        .where(Trial.job_id == job.id)
        .order_by(col(Trial.id))
    )
    return list(session.exec(query))


def test_each_job_numbers_its_own_trials_from_one(session: Session) -> None:
    first, second = seed(session), seed(session, constraints=[])
    # Interleaved: the second job's trials get global ids between the first job's.
    advance(session, first, 1)
    advance(session, second, 1)
    judge(session, first)
    judge(session, second, leaks_from="1.0.3")
    one, two = numbers(session, first), numbers(session, second)
    assert [n for _, n in one] == list(range(1, len(one) + 1))
    assert [n for _, n in two] == list(range(1, len(two) + 1))
    visited = ["1.0.0", "1.0.9", "1.0.5", "1.0.7", "1.0.6", "1.0.5", "1.0.6"]
    # --attribute: memray on both ends, then (it named no site: `judge` writes no profiles)
    # tracemalloc on both (engine/attribution.py rule 6).
    traced = ["1.0.5", "1.0.6", "1.0.5", "1.0.6"]
    assert [v for v, _ in one] == visited + traced
    kinds = session.exec(select(Trial.kind).where(Trial.job_id == first.id).order_by(col(Trial.id)))
    assert list(kinds) == ["run"] * len(visited) + ["attribute"] * len(traced)
    assert [v for v, _ in two][:3] == ["1.0.0", "1.0.9", "1.0.5"]


def test_cancel_spares_finished_trials(session: Session) -> None:
    job = seed(session)
    advance(session, job, 3)
    trials = session.exec(select(Trial).where(Trial.job_id == job.id).order_by(col(Trial.id))).all()
    assert len(trials) == 3
    trials[0].status, trials[0].verdict = TrialStatus.DONE, Verdict.CLEAN
    trials[1].status, trials[1].runner_id, trials[1].attempt = TrialStatus.LEASED, "r-1", 1
    session.add_all(trials)
    session.commit()
    assert cancel(session, job) is True
    statuses = session.exec(
        select(Trial.status).where(Trial.job_id == job.id).order_by(col(Trial.id))
    ).all()
    assert statuses == ["done", "cancelled", "cancelled"]
    assert (job.status, job.message) == (JobStatus.CANCELLED, "cancelled on request")
    assert cancel(session, job) is False
    assert cancel_open_trials(session, job) == 0


# ---------------------------------------------------------------------------- slots


def test_slots_count_live_runners_able_to_run_the_job(session: Session) -> None:
    cpu_job, gpu_job = seed(session), seed(session, requires_gpu=True)
    assert slots_for(session, cpu_job) == 1  # nobody yet: still one
    old = utcnow() - timedelta(minutes=5)
    session.add_all(
        [
            Runner(id="r-a", name="a"),
            Runner(id="r-b", name="b", gpu_count=2),
            Runner(id="r-c", name="c", gpu_count=1),
            Runner(id="r-gone", name="gone", gpu_count=1, active=False),
            Runner(id="r-stale", name="stale", last_seen=old),
        ]
    )
    session.commit()
    assert slots_for(session, cpu_job) == 3
    assert slots_for(session, gpu_job) == 2
    assert slots_for(session, cpu_job, within_s=600) == 4


def test_maintenance_advances_running_and_orphaned_jobs_only(session: Session) -> None:
    in_flight = seed(session)  # its submit request is still setting it up
    orphan = seed(session, created_at=utcnow() - timedelta(minutes=5))
    running = seed(session)
    advance(session, running, 1)
    tick(session, Settings(reap_interval_s=0))
    assert session.get(Job, in_flight.id).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert session.get(Job, orphan.id).status == JobStatus.RUNNING  # type: ignore[union-attr]
    assert queued_versions(session, orphan) == ["1.0.0"]
    assert queued_versions(session, in_flight) == []


def test_maintenance_never_advances_a_local_job(session: Session) -> None:
    """A `bisect-cli run` job in the database `serve` uses is left to its own process."""
    stale = utcnow() - timedelta(minutes=5)
    local = seed(session, local=True, created_at=stale)
    running = seed(session, local=True)
    advance(session, running, 1)  # its own process took the first step
    assert queued_versions(session, running) == ["1.0.0"]
    judge_first = session.exec(select(Trial).where(Trial.job_id == running.id)).one()
    judge_first.status, judge_first.verdict = TrialStatus.DONE, Verdict.CLEAN
    session.add(judge_first)
    session.commit()
    tick(session, Settings(reap_interval_s=0))
    assert session.get(Job, local.id).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert queued_versions(session, local) == []
    assert queued_versions(session, running) == []  # not advanced past its finished trial


def test_outcome_leads_the_message_and_creation_notes_stay(session: Session) -> None:
    note = "no pins from the good bound (candidates resolve freely): cannot resolve"
    outcome = "first bad is 1.0.6 and last good is 1.0.5, each confirmed by a second evaluation"
    job = seed(session, message=note, reuse_verdicts=False, attribute=False)
    advance(session, job, 1)
    judge(session, job)
    session.refresh(job)
    assert job.status == JobStatus.FOUND
    assert job.message == f"{outcome}\n{note}"
    # The attribution's line follows the outcome's; `judge` writes no profiles, and it says so.
    traced = seed(session, message=note, reuse_verdicts=False)
    advance(session, traced, 1)
    judge(session, traced)
    session.refresh(traced)
    untraced = "the traced run wrote no profile"
    assert traced.message == f"{outcome}\nmemray: {untraced}; tracemalloc: {untraced}\n{note}"


def listing_trial(session: Session, job: Job) -> Trial:
    query = select(Trial).where(Trial.job_id == job.id, Trial.kind == TrialKind.COMMITS)
    return session.exec(query.execution_options(populate_existing=True)).one()


def listed(session: Session, job: Job, trial: Trial, **answer: Any) -> None:
    """A runner's answer to the commits trial (runners/commits.py `report`), recorded and
    advanced as the API's complete route does."""
    spec = TrialSpec(trial_id=trial.id, kind="commits", script="",
                     env=EnvSpec(package="leakyfixture", version="1.0.6"))  # fmt: skip
    candidate = session.get(Candidate, trial.candidate_id)
    assert candidate is not None
    record_report(session, job, candidate, trial, commits.report(spec, answer))
    advance(session, job, 1)
    session.refresh(job)


REPO = "https://example.invalid/leakyfixture.git"


def test_the_commit_stage_waits_for_a_runner_to_list_the_commits(session: Session) -> None:
    """The server runs no git: a commits trial on the first bad release asks a runner for
    the list, and its answer becomes the commit candidates, each built from its sha."""
    job = seed(session, reuse_verdicts=False, attribute=False, commits=True, repo=REPO)
    advance(session, job, 1)
    judge(session, job)
    session.refresh(job)
    assert job.status == JobStatus.RUNNING  # the releases are done, the commits are not
    trial = listing_trial(session, job)
    assert (trial.status, session.get(Candidate, trial.candidate_id).version) == (  # type: ignore[union-attr]
        TrialStatus.QUEUED, "1.0.6"
    )
    assert job.commit == {"repo": REPO, "last_good_release": "1.0.5", "first_bad_release": "1.0.6"}
    assert trial_spec(job, candidates(session, job)[6], trial).commit_range == CommitRange(
        repo=REPO, package="leakyfixture", good="1.0.5", bad="1.0.6"
    )
    shas = [f"{i:040x}" for i in (5, 6, 7)]
    listed(session, job, trial, commits=[{"sha": s, "subject": f"c{s[-1]}"} for s in shas])
    made = [c for c in candidates(session, job) if c.stage == "commit"]
    assert [(c.version, c.source, c.subject) for c in made] == [
        (s[:12], f"git+{REPO}@{s}", f"c{s[-1]}") for s in shas
    ]
    assert queued_versions(session, job) == [shas[0][:12]]  # the planner's good bound first


def test_a_failed_listing_ends_the_commit_stage_and_keeps_the_release(session: Session) -> None:
    job = seed(session, reuse_verdicts=False, attribute=False, commits=True, repo=REPO)
    advance(session, job, 1)
    judge(session, job)
    why = f"no tag for leakyfixture 1.0.6 in {REPO}: tried v1.0.6, 1.0.6"
    listed(session, job, listing_trial(session, job), error=why, seconds=0.5)
    assert job.status == JobStatus.FOUND
    assert job.commit == {
        "repo": REPO, "last_good_release": "1.0.5", "first_bad_release": "1.0.6",
        "status": "error", "message": f"--commits: {why}",
    }  # fmt: skip
    assert job.stages[-1] == {
        "stage": "commit", "package": "leakyfixture", "status": "error",
        "message": f"--commits: {why}",
    }  # fmt: skip
    assert job.message.splitlines()[-1] == f"--commits: {why}"  # type: ignore[union-attr]
    assert listing_trial(session, job).error == why


# ------------------------------------------------------------------ infrastructure failures

RULE = "host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES"
REFUSAL = Failure(cause=Cause.REFUSED, host="127.0.0.1:9", rule=RULE,
                  message=f"the job's outbound rule refused 127.0.0.1:9: {RULE}")  # fmt: skip


def report_of(trial: Trial, env: EnvResult | None = None, **fields: Any) -> TrialReport:
    return TrialReport(trial_id=trial.id, attempt=trial.attempt, runner_id=trial.runner_id,  # type: ignore[arg-type]
                       env=env or EnvResult(ok=True), **fields)  # fmt: skip


def refused(trial: Trial) -> TrialReport:
    return report_of(trial, EnvResult(ok=False, error=REFUSAL.message, failure=REFUSAL))


def claimed(session: Session, job: Job, runner: Runner) -> tuple[Candidate, Trial]:
    trial = queue.claim(session, runner, lease_s=60)
    assert trial is not None and trial.job_id == job.id
    candidate = session.get(Candidate, trial.candidate_id)
    assert candidate is not None
    return candidate, trial


@pytest.mark.parametrize("where", ["bound", "middle"])
def test_a_persisting_infrastructure_failure_ends_the_job_naming_it(
    session: Session, where: str
) -> None:
    """Never a skip: not at a bound (which would end as "cannot be tested"), not in the
    middle (which the planner would step around, moving the answer). Tried INFRA_TRIES
    times, no attempt spent, no verdict stored; then the job is an error naming the host
    and the rule, its open trials cancelled."""
    runner = Runner(id="r-1", name="one")
    session.add(runner)
    session.commit()
    job = seed(session, reuse_verdicts=False, attribute=False, repeats=1)
    advance(session, job, 1)
    if where == "middle":  # the bounds are judged: the first pick inside the range fails
        for _ in range(2):
            candidate, trial = claimed(session, job, runner)
            verdict = Verdict.LEAK if candidate.version == VERSIONS[-1] else Verdict.CLEAN
            trial.status, trial.verdict, trial.analysis = TrialStatus.DONE, verdict, {}
            session.add(trial)
            session.commit()
            advance(session, job, 1)
    failed = []
    for n in range(1, queue.INFRA_TRIES + 1):
        candidate, trial = claimed(session, job, runner)
        failed.append(candidate.version)
        assert trial.attempt == 1  # the script's attempts are not spent
        assert record_report(session, job, candidate, trial, refused(trial)) is None
        advance(session, job, 1)
        session.refresh(job)
        assert job.status == (JobStatus.ERROR if n == queue.INFRA_TRIES else JobStatus.RUNNING)
    version = "1.0.0" if where == "bound" else failed[0]
    assert failed == [version] * 3
    message = (
        "stopped by an infrastructure failure, not a verdict of any release: leakyfixture "
        f"{version} failed 3 times: the job's outbound rule refused 127.0.0.1:9: {RULE}"
    )
    assert job.message == message
    assert job.result == {"status": "error", "message": message}
    spent = session.exec(
        select(Trial).where(Trial.job_id == job.id, col(Trial.error).is_not(None))
    ).one()
    assert (spent.status, spent.verdict, len(spent.infra_failures)) == ("done", None, 3)
    stored = candidates(session, job)
    assert [c.verdict for c in stored if c.version == version] == [None]
    assert queued_versions(session, job) == []
    report = build_report(job, stored, list(session.exec(select(Trial))))
    assert (report.status, report.message) == ("error", message)
    assert report.infrastructure == InfrastructureStop(
        version=version, trial=spent.number, tries=3, runners=1, cause=Cause.REFUSED,
        host="127.0.0.1:9", rule=RULE, message=REFUSAL.message,
    )  # fmt: skip
    [row] = [c for c in report.candidates if c.version == version]
    assert (row.verdict, row.testable, row.error) == (
        None,
        True,
        None,
    )  # not "skip", not untestable
    assert "untestable" not in message and "skip" not in message


def test_one_infrastructure_failure_then_a_run_is_judged_as_usual(session: Session) -> None:
    runner = Runner(id="r-1", name="one")
    session.add(runner)
    session.commit()
    job = seed(session, reuse_verdicts=False, attribute=False, repeats=1)
    advance(session, job, 1)
    candidate, trial = claimed(session, job, runner)
    record_report(session, job, candidate, trial, refused(trial))
    advance(session, job, 1)
    candidate, again = claimed(session, job, runner)
    assert (again.id, again.attempt, candidate.version) == (trial.id, 1, "1.0.0")
    assert record_report(session, job, candidate, again, report_of(again, exit_code=125)) == (
        Verdict.SKIP
    )
    advance(session, job, 1)
    session.refresh(job)
    assert (job.status, job.message) == (
        JobStatus.ERROR,
        "good bound 1.0.0 cannot be tested: its script exited 125 (the script's own skip: "
        "it cannot test it)",
    )


@pytest.mark.parametrize(
    ("failure", "why"),
    [
        (Failure(cause=Cause.NO_RESOLUTION, message="Because there is no version of x"),
         "uv found no resolution: Because there is no version of x"),
        (Failure(cause=Cause.NO_DISTRIBUTION, message="Because 1.0.9 has no wheels with a "
                 "matching platform tag"),
         "it has no wheel or sdist for the platform: Because 1.0.9 has no wheels with a "
         "matching platform tag"),
        (Failure(cause=Cause.BUILD_FAILED, message="Failed to build `x==1.0.9`"),
         "it did not build: Failed to build `x==1.0.9`"),
        (None, "its environment could not be built: python 3.99 is not available"),
    ],
)  # fmt: skip
def test_a_skipped_bound_says_which_skip_it_was(
    session: Session, failure: Failure | None, why: str
) -> None:
    runner = Runner(id="r-1", name="one")
    session.add(runner)
    session.commit()
    job = seed(session, reuse_verdicts=False, attribute=False, repeats=1)
    advance(session, job, 2)
    for _ in range(2):
        candidate, trial = claimed(session, job, runner)
        if candidate.version == VERSIONS[-1]:
            error = failure.message if failure else "python 3.99 is not available"
            report = report_of(trial, EnvResult(ok=False, error=error, failure=failure))
            assert record_report(session, job, candidate, trial, report) == Verdict.SKIP
            cause = failure.cause.value if failure else None
            assert (trial.analysis["cause"], trial.analysis["skipped"]) == (cause, why)  # type: ignore[index]
        else:
            trial.status, trial.verdict, trial.analysis = TrialStatus.DONE, Verdict.CLEAN, {}
            session.add(trial)
            session.commit()
    advance(session, job, 2)
    session.refresh(job)
    assert (job.status, job.message) == (
        JobStatus.ERROR,
        f"bad bound 1.0.9 cannot be tested: {why}",
    )
