"""Background upkeep of the service: reap expired leases, then advance open jobs.

Advancing every open job on each tick also lets jobs use runners that joined
since their last step (more free slots, more points per k-section round), and
settles a candidate whose last trial the reaper finished as an error.
"""

import logging
from datetime import timedelta

from sqlalchemy import and_, false, or_
from sqlmodel import Session, col, select

from service import queue
from service.actions import advance_job
from service.models import Job, JobStatus, utcnow
from service.settings import Settings

log = logging.getLogger(__name__)

# A job stays `queued` only while its submission is in flight (the submit request sets its
# options and advances it); one still queued after this long lost its request midway.
ORPHAN_AFTER = timedelta(seconds=60)


def tick(session: Session, settings: Settings) -> list[int]:
    """One round: returns the ids of the trials the reaper requeued or finished."""
    reaped = queue.reap(session, max_attempts=settings.max_attempts)
    for trial in reaped:
        log.info(
            "reaped trial %s of job %s: %s",
            trial.id, trial.job_id, trial.error or "lease expired, queued again",
        )  # fmt: skip
    orphaned = and_(
        col(Job.status) == JobStatus.QUEUED, col(Job.created_at) < utcnow() - ORPHAN_AFTER
    )
    # Local jobs (`bisect-cli run`) are advanced by their own process only.
    open_jobs = session.exec(
        select(Job.id)
        .where(or_(col(Job.status) == JobStatus.RUNNING, orphaned), col(Job.local) == false())
        .order_by(col(Job.id))
    ).all()
    for job_id in open_jobs:
        job = session.get(Job, job_id)
        if job is not None:
            advance_job(session, job, settings)
    return [t.id for t in reaped if t.id is not None]
