"""Dependencies of the API: settings, database sessions and bearer-token auth.

Who a token stands for and what each role may do are service rules (service/access.py);
this module takes the caller the guard authenticated (service/http/guard.py `CALLER`, or
authenticates the bearer header itself where no guard ran), refuses what a route's role
does not allow (401, 403, before the route runs) and hands routes their `Caller`,
settings and session.
"""

import logging
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.access import OPEN, Caller, authenticate
from service.db import get_engine
from service.http.guard import CALLER, MISSING
from service.settings import Settings
from service.store import MAX_ID

log = logging.getLogger(__name__)

bearer = HTTPBearer(
    auto_error=False,
    description="BISECT_API_TOKENS (or ADMIN/VIEW), or a CI job's OIDC identity token from "
    "an issuer in BISECT_OIDC_ISSUERS, for jobs and trials; BISECT_RUNNER_TOKENS for runners",
)


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_db_engine(settings: SettingsDep) -> Engine:
    return get_engine(settings.effective_database_url)


EngineDep = Annotated[Engine, Depends(get_db_engine)]


def get_session(engine: EngineDep) -> Iterator[Session]:
    with Session(engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]

# Rows a listing skips (the API's `offset`, the pages' `page` times their size) and a
# trial's id in a path: SQL's BIGINT holds at most MAX_ID, and a larger number failed in
# the database (500); bounded here it is a 422 naming the parameter.
MAX_OFFSET = MAX_ID
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="rows to skip")]
TrialIdPath = Annotated[int, Path(ge=1, le=MAX_ID)]


def _refuse(request: Request, code: int, detail: str) -> HTTPException:
    # Log who was refused and why; never the header or the token.
    client = request.client.host if request.client else "?"
    log.info("refused %s %s from %s: %s", request.method, request.url.path, client, detail)
    headers = {"WWW-Authenticate": "Bearer"} if code == status.HTTP_401_UNAUTHORIZED else None
    return HTTPException(code, detail=detail, headers=headers)


def _caller(
    request: Request, settings: Settings, credentials: HTTPAuthorizationCredentials | None
) -> Caller:
    if not settings.auth_enabled:
        return OPEN
    checked = request.scope.get(CALLER)
    if isinstance(checked, Caller):
        return checked
    if credentials is None or not credentials.credentials:
        raise _refuse(request, status.HTTP_401_UNAUTHORIZED, MISSING)
    return authenticate(settings, credentials.credentials)  # Unauthenticated: 401


def require_reader(request: Request, settings: SettingsDep, credentials: Credentials) -> Caller:
    """Reading jobs and trials: an API, admin or view token."""
    caller = _caller(request, settings, credentials)
    if caller.role == "runner":
        raise _refuse(
            request, status.HTTP_403_FORBIDDEN, "a runner token cannot be used on client endpoints"
        )
    return caller


def require_writer(request: Request, settings: SettingsDep, credentials: Credentials) -> Caller:
    """Submitting and cancelling: an API or admin token."""
    caller = require_reader(request, settings, credentials)
    if caller.role == "viewer":
        raise _refuse(request, status.HTTP_403_FORBIDDEN, "a view token can only read")
    return caller


def require_runner(request: Request, settings: SettingsDep, credentials: Credentials) -> Caller:
    """Runner endpoints: a runner token."""
    caller = _caller(request, settings, credentials)
    if caller.role not in ("open", "runner"):
        raise _refuse(
            request, status.HTTP_403_FORBIDDEN, "an API token cannot be used on runner endpoints"
        )
    return caller


ClientAuth = Depends(require_reader)
RunnerAuth = Depends(require_runner)
ReaderDep = Annotated[Caller, Depends(require_reader)]
WriterDep = Annotated[Caller, Depends(require_writer)]


def site_url(request: Request, settings: Settings) -> str:
    """Where clients reach this site (no trailing slash): `public_url` when set (behind a
    proxy), else the URL this request came to. Links in answers and reports start here."""
    return (settings.public_url or str(request.base_url)).rstrip("/")
