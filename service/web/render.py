"""Rendering: one Jinja2 environment (autoescaped), and the headers every page carries.

The Content-Security-Policy allows scripts, styles and connections from this origin only:
no inline script or style, no eval, no framing, forms posting only here. Together with
autoescaping (every value a template prints is HTML-escaped) a script that prints
`<script>` or a requirement holding `"><img onerror=...>` stays text.
"""

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import (
    ChainableUndefined,
    Environment,
    FileSystemLoader,
    Undefined,
    select_autoescape,
)

from engine import findings
from service.schemas import transition_line
from service.text import printable
from service.web import auth

HERE = Path(__file__).resolve().parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}

env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"], default_for_string=True, default=True),
    undefined=ChainableUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
# Outside text (script output, uv's notes) without control characters; escaping follows.
env.filters["printable"] = lambda text: printable(text or "")
# The stages beyond the releases, in the reports' own words (engine/findings.py).
env.globals["findings"] = lambda public: findings.sections(public, frames=3)
# A non-monotone range's transitions, in the text report's words (service/report.py).
env.globals["transition_line"] = transition_line


def _missing(value: Any) -> bool:
    # Analysis dicts are the classifier's: a figure it could not compute is None or absent.
    return value is None or isinstance(value, Undefined)


env.filters["mib"] = lambda b: "" if _missing(b) else f"{b / 1024 / 1024:.1f} MiB"
env.filters["num"] = lambda v, d=2: "" if _missing(v) else f"{v:.{d}f}"
env.filters["fig"] = lambda v, d=2, unit="": "—" if _missing(v) else f"{v:.{d}f}{unit}"
env.filters["when"] = lambda t: "" if _missing(t) else t.strftime("%Y-%m-%d %H:%M:%S")


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    """The template as a response with the security headers and, when needed, the CSRF cookie."""
    csrf = auth.csrf_token(request)
    html = env.get_template(name).render(request=request, csrf=csrf, **context)
    response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
    auth.ensure_csrf_cookie(response, request)
    return response
