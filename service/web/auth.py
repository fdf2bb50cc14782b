"""Who is looking at the status page: the API's tokens, kept in a signed session cookie.

With tokens configured (service/settings.py), the page asks for one once (`/login`). The
token is checked as the API checks it (`service.access.identify`), never stored. Rules, in
code order:

- The server secret (`session_key`): `BISECT_SECRET_KEY`, else 32 random bytes made on
  first use in `data_dir/session.key` (0600, created exclusively, so every `--workers`
  process and every restart reads the same one). Nothing about it follows from the tokens.
- The cookie holds a fingerprint of the token (an HMAC of it under the secret: it tells
  nothing about the token without the secret) and an expiry, MACed with the secret. It
  holds no role and no name: at every request the fingerprint is looked up in the token
  lists as they are configured now, so a token moved to another list changes its
  sessions' role at once, and a token removed ends them. A forged or altered cookie, or
  one made under another secret, is no session.
- Cookies are HttpOnly, SameSite=Strict, and Secure when the request came over https
  (uvicorn believes X-Forwarded-Proto from `BISECT_FORWARDED_ALLOW_IPS`) or always with
  `BISECT_SECURE_COOKIES` (a TLS proxy in front).
- Failed logins are throttled per client address (`LoginThrottle`): the
  `login_free_failures`-th failure in a row makes the next try wait 1 s, each further one
  doubles the wait, up to `login_max_delay_s`; while it lasts a login is answered 429
  with Retry-After before the token is even compared. A success forgets the address's
  failures.

POST forms carry a CSRF token: the value of a random `lb_csrf` cookie (SameSite=Strict, so
another site's form never has it) repeated in a hidden field, compared in constant time;
and a request another site sent is refused by the API's own rule (`cross_site` in
service/http/guard.py: a foreign Origin or Sec-Fetch-Site). This holds in the open service
as well: with no tokens a page on any site could otherwise post to a loopback server.

Roles are the API's (`Caller`): view tokens read everything and change nothing, API tokens
see and change their own jobs, admin tokens all; runner tokens cannot log in.
"""

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request, Response

from contract.errors import InvalidInput, LimitExceeded
from service.access import OPEN, Caller, identify, token_lists
from service.http.guard import cross_site
from service.settings import Settings

SESSION_COOKIE = "lb_session"
CSRF_COOKIE = "lb_csrf"
CSRF_FIELD = "csrf"
SESSION_S = 7 * 24 * 3600
KEY_FILE = "session.key"
KEY_BYTES = 32

_keys: dict[Path, bytes] = {}  # data_dir -> its key, read once per process


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        key = file.read(KEY_BYTES + 1)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise InvalidInput(f"{path}: must be this user's own file, mode 0600", field="secret key")
    if len(key) != KEY_BYTES:
        raise InvalidInput(f"{path}: must hold {KEY_BYTES} bytes; remove it to make a new one")
    return key


def _make_key(path: Path) -> bytes:
    """A new random key at `path`, unless another process made one first: then that one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{KEY_FILE}.{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(secrets.token_bytes(KEY_BYTES))
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)  # whole or not at all; the first process to link wins
    finally:
        temp.unlink(missing_ok=True)
    return _read_key(path)


def session_key(settings: Settings) -> bytes:
    """The server secret the cookies are signed with (see the module docstring)."""
    if settings.secret_key is not None:
        return hashlib.sha256(settings.secret_key.get_secret_value().encode()).digest()
    path = settings.data_dir / KEY_FILE
    if path not in _keys:
        try:
            _keys[path] = _read_key(path) if os.path.lexists(path) else _make_key(path)
        except OSError as exc:  # e.g. a container whose user has no writable home
            raise InvalidInput(
                f"cannot keep the session key in {path} ({exc.strerror}): set BISECT_SECRET_KEY "
                "(32+ characters) or BISECT_DATA_DIR to a directory this user can write",
                field="secret key",
            ) from None
    return _keys[path]


def _mac(key: bytes, purpose: bytes, data: bytes) -> str:
    return hmac.new(key, purpose + b"\0" + data, hashlib.sha256).hexdigest()


def _fingerprint(key: bytes, token: str) -> str:
    return _mac(key, b"token", token.encode())


def session_value(settings: Settings, token: str) -> str:
    """The cookie for a session of `token`: its fingerprint and an expiry, MACed."""
    key = session_key(settings)
    payload = json.dumps(
        {"tok": _fingerprint(key, token), "exp": int(time.time()) + SESSION_S}, sort_keys=True
    ).encode()
    return (
        base64.urlsafe_b64encode(payload).decode().rstrip("=")
        + "."
        + _mac(key, b"session", payload)
    )


def _current_caller(settings: Settings, key: bytes, fingerprint: str) -> Caller | None:
    """The caller the token with this fingerprint stands for in today's lists, or None."""
    found = None
    for _, tokens in token_lists(settings):
        for token in tokens:
            secret = token.get_secret_value()
            # Every token is compared, match or not: the time taken says nothing.
            if hmac.compare_digest(_fingerprint(key, secret), fingerprint) and found is None:
                found = secret
    return login(settings, found) if found is not None else None


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
    key = session_key(settings)
    if not hmac.compare_digest(_mac(key, b"session", payload), mac) or not isinstance(data, dict):
        return None
    expiry, fingerprint = data.get("exp"), data.get("tok")
    if not isinstance(expiry, int) or expiry < time.time() or not isinstance(fingerprint, str):
        return None
    return _current_caller(settings, key, fingerprint)


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


@dataclass
class _Failures:
    count: int
    until: float  # no login before this (monotonic seconds)
    last: float


class LoginThrottle:
    """Failed logins per client address, in one process (see the module docstring)."""

    MAX_ADDRESSES = 10_000  # the oldest are forgotten first beyond this

    def __init__(self, free: int, max_delay_s: float) -> None:
        self.free = free
        self.max_delay_s = max_delay_s
        self.failures: dict[str, _Failures] = {}

    def wait_s(self, address: str, now: float) -> int:
        """Whole seconds `address` must still wait before its next try (0: none)."""
        record = self.failures.get(address)
        return 0 if record is None else max(0, int(record.until - now + 0.999))

    def failed(self, address: str, now: float) -> None:
        record = self.failures.pop(address, None)  # re-inserted last: the newest
        if record is None or now - record.last > self.max_delay_s * 2:
            record = _Failures(0, now, now)  # a quiet address starts again
        record.count += 1
        record.last = now
        beyond = record.count - self.free  # the free-th failure already waits 1 s
        if beyond >= 0:
            record.until = now + min(2.0**beyond, self.max_delay_s)
        self.failures[address] = record
        while len(self.failures) > self.MAX_ADDRESSES:
            del self.failures[next(iter(self.failures))]

    def succeeded(self, address: str) -> None:
        self.failures.pop(address, None)


def _throttle(request: Request) -> LoginThrottle:
    state = request.app.state
    if getattr(state, "login_throttle", None) is None:
        settings: Settings = state.settings
        state.login_throttle = LoginThrottle(
            settings.login_free_failures, settings.login_max_delay_s
        )
    return state.login_throttle


def attempt_login(request: Request, token: str) -> Caller | None:
    """`login`, throttled per client address: LimitExceeded (429) while it must wait."""
    throttle = _throttle(request)
    address = request.client.host if request.client else "unknown"
    wait = throttle.wait_s(address, time.monotonic())
    if wait:
        raise LimitExceeded(
            f"too many failed logins from {address}: try again in {wait} s (after "
            f"{throttle.free} failures in a row the wait starts at 1 s and doubles with each, "
            f"up to {throttle.max_delay_s:g} s: BISECT_LOGIN_FREE_FAILURES, "
            "BISECT_LOGIN_MAX_DELAY_S)",
            retry_after_s=wait,
        )
    caller = login(request.app.state.settings, token)
    if caller is None:
        throttle.failed(address, time.monotonic())
    else:
        throttle.succeeded(address)
    return caller


def _secure(request: Request) -> bool:
    settings: Settings = request.app.state.settings
    return settings.secure_cookies or request.url.scheme == "https"


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
    """The form's token matches the cookie and no other site sent the request (the API's
    rule: service/http/guard.py `cross_site`)."""
    if cross_site(request.headers) is not None:  # Headers: case-insensitive
        return False
    cookie = request.cookies.get(CSRF_COOKIE, "")
    given = form.get(CSRF_FIELD, "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), given.encode())
