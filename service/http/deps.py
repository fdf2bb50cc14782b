"""Dependencies of the API: settings, database sessions and bearer-token auth.

Auth (docs/api.md, docs/security.md). Each configured token has a role and a name:

- API tokens (BISECT_API_TOKENS) submit jobs and read and cancel the jobs they submitted;
- admin tokens (BISECT_ADMIN_TOKENS) read and cancel every job;
- view tokens (BISECT_VIEW_TOKENS) read every job and change nothing;
- runner tokens (BISECT_RUNNER_TOKENS) open the runner endpoints only.

A request's token is compared in constant time against every configured token (no early
exit that would tell which one matched, or how much of it), and never logged or echoed.
With no token of any kind configured the service is open: every caller is `OPEN`, sees
everything and may do everything (and `serve` listens on loopback only).
"""

import hmac
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.db import get_engine
from service.settings import Settings

log = logging.getLogger(__name__)

Role = Literal["open", "client", "admin", "viewer", "runner"]

bearer = HTTPBearer(
    auto_error=False,
    description="BISECT_API_TOKENS (or ADMIN/VIEW) for jobs and trials, "
    "BISECT_RUNNER_TOKENS for runners",
)


@dataclass(frozen=True)
class Caller:
    """Who is asking: the token's role and name (None in an open service)."""

    role: Role
    name: str | None = None

    @property
    def sees_all(self) -> bool:
        return self.role in ("open", "admin", "viewer")

    def may_read(self, owner: str | None) -> bool:
        return self.sees_all or (self.role == "client" and owner == self.name)

    def may_change(self, owner: str | None) -> bool:
        return self.role in ("open", "admin") or (self.role == "client" and owner == self.name)


OPEN = Caller("open")


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


def _match(token: str, configured: list[SecretStr]) -> SecretStr | None:
    given = token.encode()
    found = None
    for candidate in configured:
        # Every token is compared, match or not: the time taken says nothing.
        if hmac.compare_digest(given, candidate.get_secret_value().encode()):
            found = candidate
    return found


def identify(settings: Settings, token: str) -> Caller | None:
    """The caller a bearer token stands for, or None when it is no configured token."""
    found: Caller | None = None
    for role, tokens in (
        ("client", settings.api_tokens),
        ("admin", settings.admin_tokens),
        ("viewer", settings.view_tokens),
        ("runner", settings.runner_tokens),
    ):
        match = _match(token, tokens)
        if match is not None and found is None:
            found = Caller(role, getattr(match, "name", None))  # type: ignore[arg-type]
    return found


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
    if credentials is None or not credentials.credentials:
        raise _refuse(
            request,
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token (Authorization: Bearer TOKEN)",
        )
    caller = identify(settings, credentials.credentials)
    if caller is None:
        raise _refuse(request, status.HTTP_401_UNAUTHORIZED, "invalid bearer token")
    return caller


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
