"""Background upkeep of the service: reap expired leases, then advance open jobs.

Advancing every open job on each tick also lets jobs use runners that joined
since their last step (more free slots, more points per k-section round), and
settles a candidate whose last trial the reaper finished as an error.
"""

import logging
import threading
from datetime import timedelta

from sqlalchemy import and_, false, or_
from sqlalchemy.engine import Engine
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


class Maintenance:
    """A daemon thread running `tick` every `settings.reap_interval_s` (0: never)."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.settings.reap_interval_s <= 0:
            return
        self._thread = threading.Thread(
            target=self._run, name="leakbisect-maintenance", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.reap_interval_s):
            try:
                with Session(self.engine) as session:
                    tick(session, self.settings)
            except Exception:  # keep going: the next tick may well succeed
                log.exception("maintenance tick failed")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
