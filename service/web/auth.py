"""Who is looking at the status page: the API's tokens, kept in a signed session cookie.

With tokens configured (service/settings.py), the page asks for one once (`/login`). The
token is checked as the API checks it (`service.access.identify`), never stored: the
cookie holds the caller's role, name, an expiry and a SHA-256 of the token, signed with a
key derived from every configured token. So a cookie is good on every worker and after a
restart, and revoking a token (or changing any) ends its sessions. Cookies are HttpOnly,
SameSite=Strict, Secure when the request came over https.

POST forms carry a CSRF token: the value of a random `lb_csrf` cookie (SameSite=Strict, so
another site's form never has it) repeated in a hidden field, compared in constant time;
a request whose Origin names another host is refused too. This holds in the open service
as well: with no tokens a page on any site could otherwise post to a loopback server.

Roles are the API's (`Caller`): view tokens read everything and change nothing, API tokens
see and change their own jobs, admin tokens all; runner tokens cannot log in.
"""

import base64
import hashlib
import hmac
import json
import secrets
import time
from urllib.parse import urlsplit

from fastapi import Request, Response

from service.access import OPEN, Caller, identify
from service.settings import Settings

SESSION_COOKIE = "lb_session"
CSRF_COOKIE = "lb_csrf"
CSRF_FIELD = "csrf"
SESSION_S = 7 * 24 * 3600


def _key(settings: Settings) -> bytes:
    digest = hashlib.sha256(b"leakbisect web session\0")
    for tokens in (settings.api_tokens, settings.admin_tokens, settings.view_tokens):
        for token in sorted(t.get_secret_value() for t in tokens):
            digest.update(token.encode() + b"\0")
    return digest.digest()


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _sign(settings: Settings, payload: bytes) -> str:
    mac = hmac.new(_key(settings), payload, hashlib.sha256).hexdigest()
    return base64.urlsafe_b64encode(payload).decode().rstrip("=") + "." + mac


def session_value(settings: Settings, caller: Caller, token: str) -> str:
    payload = {
        "role": caller.role,
        "name": caller.name,
        "exp": int(time.time()) + SESSION_S,
        "tok": _token_hash(token),
    }
    return _sign(settings, json.dumps(payload, sort_keys=True).encode())


def _still_configured(settings: Settings, digest: str) -> bool:
    found = False
    for tokens in (settings.api_tokens, settings.admin_tokens, settings.view_tokens):
        for token in tokens:
            found |= hmac.compare_digest(_token_hash(token.get_secret_value()), digest)
    return found


def caller_from_cookie(settings: Settings, value: str | None) -> Caller | None:
    """The caller a session cookie stands for, or None (absent, forged, expired, revoked)."""
    if not value or "." not in value or len(value) > 2000:
        return None
    body, _, mac = value.rpartition(".")
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    expected = hmac.new(_key(settings), payload, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, mac) or not isinstance(data, dict):
        return None
    if int(data.get("exp", 0)) < time.time() or not _still_configured(settings, str(data["tok"])):
        return None
    if data.get("role") not in ("client", "admin", "viewer"):
        return None
    return Caller(data["role"], data.get("name"))


def web_caller(request: Request) -> Caller | None:
    """Who is asking: OPEN with no tokens configured, else the session's caller or None."""
    settings: Settings = request.app.state.settings
    if not settings.auth_enabled:
        return OPEN
    return caller_from_cookie(settings, request.cookies.get(SESSION_COOKIE))


def login(settings: Settings, token: str) -> Caller | None:
    """The caller a pasted token stands for; runner tokens cannot open the page."""
    caller = identify(settings, token.strip()) if token.strip() else None
    return caller if caller is not None and caller.role != "runner" else None


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_session(response: Response, request: Request, value: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=SESSION_S,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/",
    )


def clear_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")


def csrf_token(request: Request) -> str:
    """This browser's CSRF token (made on first use; `ensure_csrf_cookie` stores it)."""
    token = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "csrf", None)
    if not token or len(token) > 100:
        token = secrets.token_urlsafe(24)
    request.state.csrf = token
    return token


def ensure_csrf_cookie(response: Response, request: Request) -> None:
    token = getattr(request.state, "csrf", None)
    if token and request.cookies.get(CSRF_COOKIE) != token:
        response.set_cookie(
            CSRF_COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=_secure(request),
            path="/",
        )


def csrf_ok(request: Request, form: dict[str, str]) -> bool:
    """The form's token matches the cookie and the request did not come from another site."""
    origin = request.headers.get("origin")
    if origin:  # "null" (a sandboxed frame, a file) is no site of ours either
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc.lower() != host.lower():
            return False
    cookie = request.cookies.get(CSRF_COOKIE, "")
    given = form.get(CSRF_FIELD, "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), given.encode())
