"""The composition root: `create_app()` mounts the API (every route under /api/v1,
docs/api.md) and the status page (`/`, docs/web.md) on one FastAPI application. The two
adapters never import each other; both call the service (service/views.py,
service/actions.py) and share service/http/.

Lifespan: migrate the database (`service.db.upgrade`), renew every lease (nobody could
heartbeat while the API was down: `service.queue.renew_leases`), then run the
maintenance thread (service/maintenance.py) until shutdown.

Errors are always `{"detail": "one line"}` (service/http/errors.py).
"""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlmodel import Session

from contract.wire import API_PREFIX
from service import queue
from service.api.routes import api_router
from service.db import get_engine, upgrade
from service.http import errors
from service.http.guard import Guard
from service.maintenance import Maintenance
from service.settings import Settings, get_settings
from service.web import install as install_web

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, migrate: bool = True) -> FastAPI:
    """The app; `migrate=False` for `serve --workers N`, whose parent migrates once."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.effective_database_url
        if migrate:
            upgrade(url)
        with Session(get_engine(url)) as session:
            renewed = queue.renew_leases(session, lease_s=settings.lease_s)
        if renewed:
            log.info("renewed %d leases held while the API was down", renewed)
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
    app.add_middleware(Guard, settings=settings)
    app.include_router(api_router, prefix=API_PREFIX)
    install_web(app)  # the status page at / (service/web/)
    return app
