"""The web status page (`/`): server-rendered pages, htmx fragments and SSE beside the API.

`install(app)` adds the routes (service/web/routes.py) and the vendored static files
(service/web/static/, see its vendor/VENDORED.md): nothing is loaded from a CDN.
"""

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from service.web.render import HERE


def install(app: FastAPI) -> None:
    from service.web.routes import router

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
