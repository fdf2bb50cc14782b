"""The local results database as a `Source` (service/cli/source.py): the server extra's.

Read with the service's read models (service/views.py; no server, no tokens); a missing
job or trial, or a database that cannot be read, is one line (service/cli/errors.py).
"""

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from contract.errors import LeakbisectError
from service import store
from service.cli.db import shown
from service.cli.errors import fail, fail_with
from service.db import get_engine
from service.schemas import JobPage, JobPublic, TrialPublic
from service.views import evidence_curves, job_markdown, job_public, job_summary, trial_public


class LocalSource:
    """The results database, read with the service's read models (no server, no tokens)."""

    def __init__(self, session: Session, url: str) -> None:
        self.session, self.url = session, url

    @classmethod
    @contextmanager
    def open(cls, url: str) -> Iterator["LocalSource"]:
        try:
            with Session(get_engine(url)) as session:
                yield cls(session, url)
        except LeakbisectError as exc:  # no such job or trial: exit 2 with its message
            fail_with(exc)
        except (SQLAlchemyError, OSError) as exc:  # a driver error is one line for the user
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            fail(f"--database-url: cannot read {shown(url)}: {first}")

    def get_job(self, job_id: int) -> JobPublic:
        return job_public(self.session, store.job(self.session, job_id))

    def list_jobs(
        self, *, status: str | None, package: str | None, limit: int, offset: int
    ) -> JobPage:
        jobs, total = store.jobs_page(
            self.session, status=status, package=package, owner=None, limit=limit, offset=offset
        )
        items = [job_summary(job, None) for job in jobs]
        return JobPage(items=items, total=total, limit=limit, offset=offset)

    def get_trial(self, job_id: int, number: int) -> TrialPublic:
        job = store.job(self.session, job_id)
        assert job.id is not None
        return trial_public(self.session, store.trial_by_number(self.session, job.id, number))

    def markdown(self, job_id: int) -> str:
        return job_markdown(self.session, store.job(self.session, job_id))

    def curves(self, report: JobPublic) -> dict[int, list[float]]:
        """The evidence runs' memory curves, for the text report's sparklines."""
        return evidence_curves(self.session, report)
