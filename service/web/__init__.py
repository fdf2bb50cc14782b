"""The web status page (`/`): server-rendered pages, htmx fragments and SSE beside the API.

`install(app)` adds the routes (service/web/routes.py) and the vendored static files
(service/web/static/, see its vendor/VENDORED.md): nothing is loaded from a CDN.
"""

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"


def install(app: FastAPI) -> None:
    # Imported here: the routes import the API's modules, which import this package.
    from service.web.routes import router

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
