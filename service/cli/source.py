"""Where `status`, `list`, `logs` and `report` read jobs: a server, or the local database.

A command asks a server when `--server` is given or `BISECT_SERVER` is set; otherwise it
reads the results database that `bisect-cli run` writes (`--database-url`, else
`BISECT_DATABASE_URL`, else the per-user SQLite file). Both sources answer in the API's
models (service/schemas.py): the local one builds them with the functions the API calls
(service/views.py), the remote one reads the server's answer into them once, so every
command prints one way whichever it is.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from contract.errors import LeakbisectError
from service import store
from service.cli.db import results_database, shown
from service.cli.errors import fail, fail_with
from service.cli.remote import DEFAULT_SERVER, api_errors, make_client
from service.db import get_engine
from service.schemas import JobPage, JobPublic, TrialPublic
from service.views import job_markdown, job_public, job_summary, trial_public


class Source(Protocol):
    def get_job(self, job_id: int) -> JobPublic: ...
    def list_jobs(
        self, *, status: str | None, package: str | None, limit: int, offset: int
    ) -> JobPage: ...
    def get_trial(self, job_id: int, number: int) -> TrialPublic: ...
    def markdown(self, job_id: int) -> str: ...


def is_remote(server: str | None) -> bool:
    """True when the user named a server (flag or BISECT_SERVER)."""
    return bool(server) or bool(os.environ.get("BISECT_SERVER", "").strip())


@contextmanager
def open_source(
    server: str | None, token: str | None, database_url: str | None, *, local: bool = False
) -> Iterator[Source]:
    """The source the flags and environment name, its errors as one line and a status;
    `local` reads the local database even when BISECT_SERVER is set."""
    if not local and is_remote(server):
        if database_url:
            fail("--database-url: reads a local database; drop it or --server/BISECT_SERVER")
        url = server or os.environ.get("BISECT_SERVER", "").strip() or DEFAULT_SERVER
        with make_client(url, token) as client, api_errors():
            yield RemoteSource(client)
        return
    url = results_database(database_url)
    with LocalSource.open(url) as source:
        yield source


class RemoteSource:
    def __init__(self, client: Any) -> None:
        self.client = client

    def get_job(self, job_id: int) -> JobPublic:
        return JobPublic.model_validate(self.client.get_job(job_id))

    def list_jobs(
        self, *, status: str | None, package: str | None, limit: int, offset: int
    ) -> JobPage:
        page = self.client.list_jobs(status=status, package=package, limit=limit, offset=offset)
        return JobPage.model_validate(page)

    def get_trial(self, job_id: int, number: int) -> TrialPublic:
        return TrialPublic.model_validate(self.client.get_job_trial(job_id, number))

    def markdown(self, job_id: int) -> str:
        return self.client.request("GET", f"/jobs/{job_id}/report.md").text


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
