"""Reads of stored jobs, candidates, trials and samples: every query that only looks.

Writes that touch a lease are service/queue.py's; the rest of the writes belong to the
code that owns the row (jobs.py creates jobs, trials.py records reports, scheduler.py
advances). Lookups by id raise `NotFound` kinds, which the API answers with 404 and the
CLI with exit 2. Lists come back in one documented order each.
"""

from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from contract.errors import NotFound
from service.models import Candidate, Job, JobStatus, MemorySample, Runner, Trial, TrialKind

# Ids are 64-bit in every database; anything larger names nothing.
MAX_ID = (1 << 63) - 1


class JobNotFound(NotFound):
    """No job with that id."""


class TrialNotFound(NotFound):
    """No trial with that id."""


def job(session: Session, job_id: int) -> Job:
    found = session.get(Job, job_id) if 0 < job_id <= MAX_ID else None
    if found is None:
        raise JobNotFound(f"job {job_id} not found")
    return found


def trial(session: Session, trial_id: int) -> Trial:
    found = session.get(Trial, trial_id) if 0 < trial_id <= MAX_ID else None
    if found is None:
        raise TrialNotFound(f"trial {trial_id} not found")
    return found


def candidates_of(session: Session, job: Job, stage: str | None = "") -> list[Candidate]:
    """The candidates of one of the job's stages (service/stages.py; "" its releases, None
    all of them), oldest first (by position), fresh from the database."""
    query = select(Candidate).where(Candidate.job_id == job.id)
    if stage is not None:
        query = query.where(col(Candidate.stage) == stage)
    query = query.order_by(col(Candidate.position))
    return list(session.exec(query.execution_options(populate_existing=True)))


def trials_of(session: Session, job: Job) -> list[Trial]:
    """The job's trials in the order they were queued (by id), fresh from the database."""
    query = select(Trial).where(Trial.job_id == job.id).order_by(col(Trial.id))
    return list(session.exec(query.execution_options(populate_existing=True)))


def next_trial_number(session: Session, job_id: int) -> int:
    """The number the job's next trial gets: 1 + the highest so far (the caller holds
    `queue.job_lock`, as every advance does, so two trials never get the same one; the
    unique constraint on (job_id, number) would refuse it if they did)."""
    query = select(func.max(Trial.number)).where(Trial.job_id == job_id)
    return (session.exec(query).one() or 0) + 1


def add_trials(
    session: Session,
    job: Job,
    candidate: Candidate,
    evaluation: int,
    count: int,
    hints: dict[str, str] | None = None,
    *,
    kind: str = TrialKind.RUN,
    trace: str | None = None,
) -> None:
    """Queue `count` trials of `candidate` (the caller holds the job's lock and commits)."""
    assert job.id is not None
    for _ in range(count):
        session.add(
            Trial(
                job_id=job.id,
                number=next_trial_number(session, job.id),
                candidate_id=candidate.id,  # type: ignore[arg-type]
                evaluation=evaluation,
                hints=dict(hints or {}),
                kind=kind,
                trace=trace,
            )
        )


def trial_by_number(session: Session, job_id: int, number: int) -> Trial:
    found = None
    if 0 < number <= MAX_ID:
        query = select(Trial).where(Trial.job_id == job_id, Trial.number == number)
        found = session.exec(query).first()
    if found is None:
        raise TrialNotFound(f"job {job_id} has no trial {number}")
    return found


def samples_of(session: Session, trial_ids: list[int]) -> dict[int, list[MemorySample]]:
    """Each trial's samples in time order (ties by insertion)."""
    out: dict[int, list[MemorySample]] = {i: [] for i in trial_ids}
    query = (
        select(MemorySample)
        .where(col(MemorySample.trial_id).in_(trial_ids))
        .order_by(col(MemorySample.trial_id), col(MemorySample.t), col(MemorySample.id))
    )
    for sample in session.exec(query):
        out[sample.trial_id].append(sample)
    return out


def steps_printed(session: Session, trial_ids: list[int]) -> dict[int, int]:
    """Per trial with step markers: how many steps it printed (last minus first, plus one).

    One aggregate over the trial_id index, not the samples themselves: cheap under a lock.
    """
    if not trial_ids:
        return {}
    step = col(MemorySample.step)
    rows = session.exec(
        select(MemorySample.trial_id, func.min(step), func.max(step))
        .where(col(MemorySample.trial_id).in_(trial_ids), step.is_not(None))
        .group_by(col(MemorySample.trial_id))
    ).all()
    return {trial_id: high - low + 1 for trial_id, low, high in rows}


def samples_page(
    session: Session, trial_id: int, *, offset: int = 0, limit: int | None = None
) -> tuple[list[MemorySample], int]:
    """A slice of one trial's samples in time order (ties by insertion), and how many it
    has in all."""
    where = col(MemorySample.trial_id) == trial_id
    total = session.exec(select(func.count()).select_from(MemorySample).where(where)).one()
    query = (
        select(MemorySample)
        .where(where)
        .order_by(col(MemorySample.t), col(MemorySample.id))
        .offset(offset)
        .limit(limit)
    )
    return list(session.exec(query)), total


def runner_by_secret_hash(session: Session, secret_hash: str) -> Runner | None:
    """The runner whose registration returned the secret with this sha256, if any."""
    query = select(Runner).where(col(Runner.secret_hash) == secret_hash)
    return session.exec(query.execution_options(populate_existing=True)).first()


def job_by_idempotency(session: Session, idempotency: str) -> Job | None:
    """The job a submission with this (owner, key) digest created, if any."""
    return session.exec(select(Job).where(col(Job.idempotency) == idempotency)).first()


def _canonical(column: Any) -> Any:
    # PEP 503 in portable SQL: lower case, with '_' and '.' read as '-'.
    return func.lower(func.replace(func.replace(column, "_", "-"), ".", "-"))


def _canonical_text(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def jobs_page(
    session: Session,
    *,
    status: JobStatus | None = None,
    package: str | None = None,
    owner: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Job], int]:
    """A page of jobs, newest first, and how many match in all (names compare as PEP 503);
    `owner`: only that token's jobs."""
    where = []
    if owner is not None:
        where.append(col(Job.owner) == owner)
    if status is not None:
        where.append(col(Job.status) == status.value)
    if package:
        # The package searched now (`Job.target`): a --from/--to job's first culprit.
        searched = func.coalesce(col(Job.search)["package"].as_string(), col(Job.package))
        where.append(_canonical(searched) == _canonical_text(package))
    total = session.exec(select(func.count()).select_from(Job).where(*where)).one()
    query = select(Job).where(*where).order_by(col(Job.id).desc()).offset(offset).limit(limit)
    return list(session.exec(query)), total
