"""The composition root: `create_app()` mounts the API (every route under /api/v1,
docs/api.md) and the status page (`/`, docs/web.md) on one FastAPI application. The two
adapters never import each other; both call the service (service/views.py,
service/actions.py) and share service/http/.

Lifespan: migrate the database (`service.db.upgrade`), renew every lease (nobody could
heartbeat while the API was down: `service.queue.renew_leases`), then run the
maintenance thread (service/maintenance.py) and the webhooks' delivery thread
(service/webhooks.py) until shutdown.

Errors are always `{"detail": "one line"}` (service/http/errors.py).

`/docs` is the API reference rendered here from the OpenAPI schema (`/openapi.json`) as
plain HTML with the status page's security headers (its CSP, no framing): FastAPI's
Swagger UI and ReDoc pages load their scripts from a CDN and carry no CSP, so they are
off. The schema itself is what clients and tools read.
"""

import html
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from sqlmodel import Session

from contract.wire import API_PREFIX
from service import queue
from service.api.routes import api_router
from service.db import get_engine, upgrade
from service.http import errors
from service.http.guard import Guard
from service.maintenance import tick
from service.periodic import Periodic
from service.settings import Settings, get_settings
from service.web import install as install_web
from service.web.auth import session_key
from service.web.render import SECURITY_HEADERS
from service.webhooks import deliver_due

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, migrate: bool = True) -> FastAPI:
    """The app; `migrate=False` for `serve --workers N`, whose parent migrates once."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.effective_database_url
        if migrate:
            upgrade(url)
        if settings.auth_enabled:
            session_key(settings)  # made or read now: a bad key file fails the start
        with Session(get_engine(url)) as session:
            renewed = queue.renew_leases(session, lease_s=settings.lease_s)
        if renewed:
            log.info("renewed %d leases held while the API was down", renewed)
        engine = get_engine(url)
        maintenance = Periodic(
            "leakbisect-maintenance", engine, settings.reap_interval_s, lambda s: tick(s, settings)
        )
        deliverer = Periodic(
            "leakbisect-webhooks",
            engine,
            settings.webhook_interval_s,
            lambda s: deliver_due(s, settings),
        )
        maintenance.start()
        deliverer.start()
        if not settings.auth_enabled:
            log.warning("no API or runner tokens configured: the API is open to anyone")
        try:
            yield
        finally:
            deliverer.stop()
            maintenance.stop()

    app = FastAPI(
        title="leakbisect",
        summary="Find the first release of a dependency that leaks memory.",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # ours below: no CDN, the pages' headers
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.settings = settings
    errors.install(app)
    app.add_middleware(Guard, settings=settings)
    app.include_router(api_router, prefix=API_PREFIX)
    install_web(app)  # the status page at / (service/web/)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(reference_page(app.openapi()), headers=SECURITY_HEADERS)

    return app


def reference_page(schema: dict[str, Any]) -> str:
    """The API reference as HTML: every route's method, path, summary and parameters;
    every text escaped (a route's description is ours, but the rule is one)."""
    e = html.escape
    info = schema.get("info", {})
    rows = []
    for path, methods in schema.get("paths", {}).items():
        for method, op in methods.items():
            params = ", ".join(e(p.get("name", "")) for p in op.get("parameters", []))
            body = " (JSON body)" if "requestBody" in op else ""
            rows.append(
                f"<h2><code>{e(method.upper())} {e(path)}</code></h2>"
                f"<p>{e(op.get('summary', ''))}{e(body)}</p>"
                + (f"<p>parameters: {params}</p>" if params else "")
                + f"<p>{e(op.get('description', ''))}</p>"
            )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(info.get('title', 'API'))} API</title>"
        '<link rel="stylesheet" href="/static/app.css"></head><body><main>'
        f"<h1>{e(info.get('title', 'API'))} API {e(str(info.get('version', '')))}</h1>"
        f"<p>{e(info.get('summary', ''))} The schema: "
        '<a href="/openapi.json">/openapi.json</a>.</p>' + "".join(rows) + "</main></body></html>"
    )
