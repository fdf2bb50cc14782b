"""The FastAPI application: `create_app()`; every route is under /api/v1 (docs/api.md).

Lifespan: migrate the database (`service.db.upgrade`), then run the
maintenance thread (service/api/maintenance.py) until shutdown.

Errors are always `{"detail": "one line"}` (service/api/errors.py).
"""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.responses import Response

from runners.wire import API_PREFIX
from service.api import errors
from service.api.maintenance import Maintenance
from service.api.routes import api_router
from service.db import get_engine, upgrade
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)

# A 1 MiB script is at most ~6 MiB of JSON (\uXXXX escapes); anything bigger is refused unread.
MAX_SUBMIT_BYTES = 8 * 1024 * 1024


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
    errors.install(app)
    app.add_middleware(_SubmitSizeLimit)
    app.include_router(api_router, prefix=API_PREFIX)
    return app
