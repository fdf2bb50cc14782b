"""The web status page (`/`): server-rendered pages, htmx fragments and SSE beside the API.

`install(app)` adds the routes (service/web/routes.py) and the vendored static files
(service/web/static/, see its vendor/VENDORED.md): nothing is loaded from a CDN. The
composition root (service/app.py) calls it; the page reads and changes jobs through the
service (service/views.py, service/actions.py), never through the API.
"""

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from service.web.routes import router

STATIC = Path(__file__).resolve().parent / "static"


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
