"""The FastAPI application: `create_app()`; every route is under /api/v1 (docs/api.md).

Lifespan: migrate the database (`service.db.upgrade`), then run the
maintenance thread (service/api/maintenance.py) until shutdown.

Errors are always `{"detail": "one line"}`: request validation errors name the
field ("memory_limit: '12X' is not a positive size ..."), a range the index
cannot serve is "range: ...".
"""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.responses import Response

from service.api.maintenance import Maintenance
from service.api.routes import api_router
from service.db import get_engine, upgrade
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
# A 1 MiB script is at most ~6 MiB of JSON (\uXXXX escapes); anything bigger is refused unread.
MAX_SUBMIT_BYTES = 8 * 1024 * 1024


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "cookie")]
    return ".".join(parts) or (str(loc[0]) if loc else "request")


def _message(error: dict[str, Any]) -> str:
    if error.get("type") == "missing":
        return "field required"
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error")
        return f"invalid JSON{f' ({reason})' if reason else ''}"
    msg = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg.splitlines()[0] if msg else "invalid"


def validation_detail(exc: RequestValidationError) -> str:
    """All errors on one line: "field: message; other: message"."""
    parts = []
    for error in exc.errors():
        loc = error.get("loc", ())
        field = "body" if error.get("type") == "json_invalid" else _field(loc)
        parts.append(f"{field}: {_message(error)}")
    return "; ".join(dict.fromkeys(parts)) or "invalid request"


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
        content={"detail": validation_detail(exc)},
    )


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
        content={"detail": f"internal server error ({type(exc).__name__})"},
    )


class _SubmitSizeLimit(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.method == "POST" and request.url.path.rstrip("/") == f"{API_PREFIX}/jobs":
            length = request.headers.get("content-length", "")
            if length.isdigit() and int(length) > MAX_SUBMIT_BYTES:
                return JSONResponse(
                    status_code=status.HTTP_413_CONTENT_TOO_LARGE,
                    content={"detail": "script: the request is larger than 8 MiB"},
                )
        return await call_next(request)


def create_app(settings: Settings | None = None, *, migrate: bool = True) -> FastAPI:
    """The app; `migrate=False` for `serve --workers N`, whose parent migrates once."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.effective_database_url
        if migrate:
            upgrade(url)
        maintenance = Maintenance(get_engine(url), settings)
        maintenance.start()
        if not settings.auth_enabled:
            log.warning("no API or runner tokens configured: the API is open to anyone")
        try:
            yield
        finally:
            maintenance.stop()

    app = FastAPI(
        title="leakbisect",
        summary="Find the first release of a dependency that leaks memory.",
        version="1",
        lifespan=lifespan,
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_middleware(_SubmitSizeLimit)
    app.include_router(api_router, prefix=API_PREFIX)
    return app
