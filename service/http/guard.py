"""The API's outer wall, in front of every route (an ASGI middleware): checks that cost
nothing come before anything reads the request body.

In this order, for every HTTP request:

1. Host. With no tokens configured the API answers only requests whose Host header is
   one of `Settings.trusted_hosts` (127.0.0.1, localhost, ::1 by default): a web page
   that makes a browser send requests to a name it controls (DNS rebinding) gets 400.
2. Token. With tokens or OIDC issuers configured, a request under the API prefix without
   a bearer token that `service.access.authenticate` takes is refused before its body is
   read: 401 with one line (an identity token's says what was wrong with it), or 503 when
   its issuer's keys cannot be fetched now. An identity token is checked in a worker
   thread (a key fetch must not stall the event loop). The caller found is left in the
   request's scope (`CALLER`), where the route's own dependency takes it to check its role
   (service/http/deps.py).
3. Same site. A request that changes something under the API prefix (any method but
   GET, HEAD and OPTIONS), token or not, is refused (403) when `cross_site` says another
   site sent it. The web forms obey the same rule (service/web/auth.py `csrf_ok`).
4. Size, then JSON only. The body may be at most `limit_for(method, path)` bytes: a
   Content-Length above it is refused at once (413). Then such a request, if a POST or
   if it has a body, must say `Content-Type: application/json` (415): no page on another
   site may send that type without the browser asking first (a CORS preflight, which
   this server never grants), so no form, `fetch(..., {mode: "no-cors"})` or bodyless
   POST of a foreign page reaches a route; DELETE, PUT and PATCH are preflighted anyway.
   A body sent without a length (chunked) is read up to the limit and refused (413) as
   soon as it passes it, so the server never holds more than the limit of any request.
   The body read is then handed to the route unchanged.
"""

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread

from contract.errors import Unauthenticated, Unavailable
from contract.wire import API_PREFIX
from service.access import Caller, authenticate
from service.http import errors
from service.settings import Settings

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KIB, MIB = 1024, 1024 * 1024
# A 1 MiB script is at most ~6 MiB of JSON (\uXXXX escapes).
SUBMIT_LIMIT = 8 * MIB
# MAX_REPORT_SAMPLES samples of ~120 bytes of JSON each, steps, a 64 KiB log tail, pins.
REPORT_LIMIT = 16 * MIB
DEFAULT_LIMIT = 256 * KIB
_REPORT = re.compile(rf"^{re.escape(API_PREFIX)}/trials/[^/]+/complete/?$")
_SUBMIT = re.compile(rf"^{re.escape(API_PREFIX)}/jobs/?$")
# The ASGI scope key the guard leaves the authenticated `Caller` under.
CALLER = "leakbisect.caller"
MISSING = "missing bearer token (Authorization: Bearer TOKEN)"


def limit_for(method: str, path: str) -> int:
    """The most bytes a request body may have."""
    if method == "POST" and _SUBMIT.match(path):
        return SUBMIT_LIMIT
    if method == "POST" and _REPORT.match(path):
        return REPORT_LIMIT
    return DEFAULT_LIMIT


def _too_large(limit: int, path: str) -> tuple[int, str]:
    what = "script: the request" if _SUBMIT.match(path) else "the request body"
    size = f"{limit // MIB} MiB" if limit >= MIB else f"{limit // KIB} KiB"
    return 413, f"{what} is larger than {size}"


async def _answer(
    send: Send, status: int, detail: str, extra: dict[str, str] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values a browser sends for a request this site's own page (or the user,
# typing the address) made; "same-site" is a sibling host, "cross-site" any other.
OWN_FETCH_SITES = frozenset({"same-origin", "none"})
JSON_TYPE = "application/json"


def cross_site(headers: Mapping[str, str]) -> str | None:
    """Why another site sent this request (one line), or None when nothing says so.

    `Sec-Fetch-Site` other than same-origin or none, or an `Origin` that is not the Host
    the request was sent to ("null", from a sandboxed frame or a file, is no site of ours
    either). Clients that are no browser (the CLI, runners) send neither.
    """
    fetch_site = headers.get("sec-fetch-site", "").strip().lower()
    if fetch_site and fetch_site not in OWN_FETCH_SITES:
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site[:40]})"
    origin = headers.get("origin")
    if origin is not None:
        try:
            netloc = urlsplit(origin.strip()).netloc.lower()
        except ValueError:  # a malformed IPv6 literal
            netloc = ""
        if not netloc or netloc != headers.get("host", "").strip().lower():
            return f"cross-site request refused: Origin {origin[:100]!r} is not this server"
    return None


def _not_json(method: str, headers: Mapping[str, str]) -> str | None:
    """Why a state-changing request's content type is refused, or None."""
    has_body = headers.get("content-length", "0") not in ("", "0") or (
        "transfer-encoding" in headers
    )
    if method != "POST" and not has_body:
        return None  # a bodyless DELETE: browsers preflight it, nothing to read
    given = headers.get("content-type", "")
    if given.split(";", 1)[0].strip().lower() == JSON_TYPE:
        return None
    shown = given.split(";", 1)[0].strip()[:60] or "none"
    return f"Content-Type: must be {JSON_TYPE}, even with no body (got {shown})"


def _host(headers: dict[str, str]) -> str:
    host = headers.get("host", "")
    if host.startswith("["):  # [::1]:8000
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """See the module docstring; `settings` is the app's."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def _authenticate(self, token: str) -> Caller:
        if self.settings.oidc_issuers:  # a JWKS fetch may wait on the network
            return await anyio.to_thread.run_sync(authenticate, self.settings, token)
        return authenticate(self.settings, token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = await self._refusal(scope, headers)
        if refusal is not None:
            status, detail, extra = refusal
            return await _answer(send, status, detail, extra)
        limit = limit_for(scope["method"], scope["path"])
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            return await _answer(send, *_too_large(limit, scope["path"]))
        if scope["path"].startswith(API_PREFIX) and scope["method"] not in SAFE_METHODS:
            wrong_type = _not_json(scope["method"], headers)
            if wrong_type is not None:
                return await _answer(send, 415, wrong_type)
        body = await _read(receive, limit)
        if body is None:
            return await _answer(send, *_too_large(limit, scope["path"]))
        await self.app(scope, _replay(body, receive), send)

    async def _refusal(
        self, scope: Scope, headers: dict[str, str]
    ) -> tuple[int, str, dict[str, str] | None] | None:
        settings = self.settings
        if not settings.auth_enabled:
            host = _host(headers).lower()
            if host not in settings.trusted_hosts:
                return (
                    400,
                    f"Host {host or '(none)'} is not served: with no tokens configured the API "
                    f"answers only to {', '.join(settings.trusted_hosts)} (BISECT_TRUSTED_HOSTS)",
                    None,
                )
        if not scope["path"].startswith(API_PREFIX):
            return None
        if settings.auth_enabled:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return 401, MISSING, _CHALLENGE
            try:
                scope[CALLER] = await self._authenticate(token.strip())
            except (Unauthenticated, Unavailable) as exc:
                # Who was refused and why; never the header or the token.
                client = (scope.get("client") or ("?",))[0]
                log.info("refused %s %s from %s: %s", scope["method"], scope["path"], client, exc)
                return errors.http_status(exc), exc.detail(), errors.headers(exc)
        if scope["method"] in SAFE_METHODS:
            return None
        foreign = cross_site(headers)
        if foreign is not None:
            return 403, foreign, None
        return None


_CHALLENGE = {"www-authenticate": "Bearer"}


async def _read(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # disconnected: the route sees what came
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then wait for the disconnect, as a server's receive does

    return replay
