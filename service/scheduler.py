"""Advancing jobs: close finished evaluations, ask the planner, queue trials.

The planner and the classifier decide; this module only moves rows. Both the
local `bisect-cli run` loop and the service call `advance` after every
completed trial, so the two modes walk exactly the same path.
"""

from collections import defaultdict
from statistics import median

from sqlmodel import Session, col, select

from service.analysis import aggregate, needs_more_runs
from service.models import Candidate, Job, JobStatus, Trial, TrialStatus, utcnow
from service.planner import CandidateState, Outcome, Plan, plan
from service.verdicts import Verdict


def candidates_of(session: Session, job: Job) -> list[Candidate]:
    query = select(Candidate).where(Candidate.job_id == job.id).order_by(col(Candidate.position))
    return list(session.exec(query))


def trials_of(session: Session, job: Job) -> list[Trial]:
    query = select(Trial).where(Trial.job_id == job.id).order_by(col(Trial.id))
    return list(session.exec(query))


def _queue(session: Session, job: Job, candidate: Candidate, evaluation: int, count: int) -> None:
    for _ in range(count):
        session.add(Trial(job_id=job.id, candidate_id=candidate.id, evaluation=evaluation))


def _close_or_extend(session: Session, job: Job, candidate: Candidate, trials: list[Trial]) -> bool:
    """Settle the candidate's open evaluation; True while it is still running."""
    if any(t.status in (TrialStatus.QUEUED, TrialStatus.LEASED) for t in trials):
        return True
    verdicts = [Verdict(t.verdict) for t in trials if t.verdict]
    if needs_more_runs(verdicts, job.repeats, job.max_runs):
        _queue(session, job, candidate, trials[0].evaluation, 1)
        return True
    verdict = aggregate(verdicts)
    candidate.evaluations = [*candidate.evaluations, verdict.value]
    candidate.verdict = verdict.value
    growth = [
        t.analysis["growth_mib"]
        for t in trials
        if t.analysis and t.analysis.get("growth_mib") is not None
    ]
    candidate.growth_mib = median(growth) if growth else None
    session.add(candidate)
    return False


def advance(session: Session, job: Job, slots: int) -> Plan:
    """Move `job` one step: returns the planner's answer after queueing its picks."""
    if JobStatus(job.status).finished:
        return Plan(run=(), outcome=None)
    candidates = candidates_of(session, job)
    open_trials: dict[int, list[Trial]] = defaultdict(list)
    for trial in trials_of(session, job):
        if trial.status == TrialStatus.CANCELLED:
            continue
        candidate = next(c for c in candidates if c.id == trial.candidate_id)
        if trial.evaluation > len(candidate.evaluations):
            open_trials[candidate.id].append(trial)  # type: ignore[index]

    running = {
        c.id
        for c in candidates
        if c.id in open_trials and _close_or_extend(session, job, c, open_trials[c.id])  # type: ignore[index]
    }
    states = [
        CandidateState(
            version=c.version,
            testable=c.testable,
            verdicts=tuple(Verdict(v) for v in c.evaluations),
            running=c.id in running,
        )
        for c in candidates
    ]
    step = plan(states, slots, find_fix=job.find_fix)
    for index in step.run:
        candidate = candidates[index]
        _queue(session, job, candidate, len(candidate.evaluations) + 1, job.repeats)
    if step.outcome is not None:
        finish(session, job, step.outcome, candidates)
    elif job.status == JobStatus.QUEUED:
        job.status = JobStatus.RUNNING
    job.updated_at = utcnow()
    session.add(job)
    session.commit()
    return step


def finish(session: Session, job: Job, outcome: Outcome, candidates: list[Candidate]) -> None:
    def version(index: int | None) -> str | None:
        return None if index is None else candidates[index].version

    job.status = outcome.status
    job.message = outcome.message
    job.finished_at = utcnow()
    job.result = {
        "status": outcome.status,
        "last_old": version(outcome.last_old),
        "first_new": version(outcome.first_new),
        "skipped": [candidates[i].version for i in outcome.skipped],
        "message": outcome.message,
    }
    cancel_open_trials(session, job)


def cancel_open_trials(session: Session, job: Job) -> None:
    query = select(Trial).where(Trial.job_id == job.id, col(Trial.status) == TrialStatus.QUEUED)
    for trial in session.exec(query):
        trial.status = TrialStatus.CANCELLED
        session.add(trial)
