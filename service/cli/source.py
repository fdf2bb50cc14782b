"""Where `status`, `list`, `logs` and `report` read jobs: a server, or the local database.

A command asks a server when `--server` is given or `BISECT_SERVER` is set; otherwise it
reads the results database that `bisect-cli run` writes (`--database-url`, else
`BISECT_DATABASE_URL`, else the per-user SQLite file). Both sources answer in the API's
models (service/schemas.py): the local one (service/cli/localdb.py) builds them with the
functions the API calls (service/views.py), the remote one reads the server's answer into
them once, so every command prints one way whichever it is.

This module is the client's (the default install: httpx, pydantic); the local database is
the server extra's, imported only when it is read: without the extra that is one line
naming it, exit 2 (service/cli/errors.py `needs_extra`).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from service.cli.errors import fail, needs_extra
from service.cli.remote import DEFAULT_SERVER, api_errors, make_client
from service.schemas import JobPage, JobPublic, TrialPublic


class Source(Protocol):
    def get_job(self, job_id: int) -> JobPublic: ...
    def list_jobs(
        self, *, status: str | None, package: str | None, limit: int, offset: int
    ) -> JobPage: ...
    def get_trial(self, job_id: int, number: int) -> TrialPublic: ...
    def markdown(self, job_id: int) -> str: ...
    def curves(self, report: JobPublic) -> dict[int, list[float]]: ...


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
    try:
        from service.cli.db import results_database
        from service.cli.localdb import LocalSource
    except ModuleNotFoundError as exc:
        needs_extra("the local results database (read without --server or BISECT_SERVER)", exc)
    with LocalSource.open(results_database(database_url)) as source:
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

    def curves(self, report: JobPublic) -> dict[int, list[float]]:
        """No curves for the text report: a server's are a request per run away, and the
        page draws them better."""
        return {}
