"""Dependencies of the API: settings, database sessions and bearer-token auth.

Auth (docs/api.md): `api_tokens` open the client endpoints (jobs, trials),
`runner_tokens` the runner endpoints. Tokens are compared in constant time
against every configured token (no early exit that would tell which one
matched, or how much of it), and never logged or echoed. With no token of
either kind configured the service is open.
"""

import hmac
import logging
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.db import get_engine
from service.settings import Settings

log = logging.getLogger(__name__)

bearer = HTTPBearer(
    auto_error=False,
    description="BISECT_API_TOKENS for jobs and trials, BISECT_RUNNER_TOKENS for runners",
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


def _matches(token: str, configured: list[SecretStr]) -> bool:
    given = token.encode()
    found = False
    for candidate in configured:
        # Every token is compared, match or not: the time taken says nothing.
        found |= hmac.compare_digest(given, candidate.get_secret_value().encode())
    return found


def _refuse(request: Request, code: int, detail: str) -> HTTPException:
    # Log who was refused and why; never the header or the token.
    client = request.client.host if request.client else "?"
    log.info("refused %s %s from %s: %s", request.method, request.url.path, client, detail)
    headers = {"WWW-Authenticate": "Bearer"} if code == status.HTTP_401_UNAUTHORIZED else None
    return HTTPException(code, detail=detail, headers=headers)


def _check(
    request: Request,
    settings: Settings,
    credentials: HTTPAuthorizationCredentials | None,
    kind: str,
) -> None:
    if not settings.auth_enabled:
        return
    if credentials is None or not credentials.credentials:
        raise _refuse(
            request,
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token (Authorization: Bearer TOKEN)",
        )
    is_api = _matches(credentials.credentials, settings.api_tokens)
    is_runner = _matches(credentials.credentials, settings.runner_tokens)
    if (kind == "client" and is_api) or (kind == "runner" and is_runner):
        return
    if is_api:
        raise _refuse(
            request, status.HTTP_403_FORBIDDEN, "an API token cannot be used on runner endpoints"
        )
    if is_runner:
        raise _refuse(
            request, status.HTTP_403_FORBIDDEN, "a runner token cannot be used on client endpoints"
        )
    raise _refuse(request, status.HTTP_401_UNAUTHORIZED, "invalid bearer token")


def require_client(request: Request, settings: SettingsDep, credentials: Credentials) -> None:
    """Jobs and trials: an API token."""
    _check(request, settings, credentials, "client")


def require_runner(request: Request, settings: SettingsDep, credentials: Credentials) -> None:
    """Runner endpoints: a runner token."""
    _check(request, settings, credentials, "runner")


ClientAuth = Depends(require_client)
RunnerAuth = Depends(require_runner)
