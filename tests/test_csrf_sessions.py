"""Issue 26 rows 3, 4 and 9 and the stream cap of row 8: no cross-site request changes
anything, API or page; sessions follow the token lists and a server secret; failed logins
are throttled; the event streams tell a client only of jobs it may read, and a client may
hold only so many; /docs has the pages' headers and no CDN.

Each test failed on the code before the change (see /tmp/b26/C.md for how that was checked).
"""

import base64
import hashlib
import hmac
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlmodel import Session

from contract.errors import InvalidInput
from runners.client import ApiClient
from service.app import create_app
from service.db import get_engine
from service.models import Job, JobStatus, utcnow
from service.settings import Settings, get_settings
from service.web import events
from service.web.auth import KEY_FILE, LoginThrottle, session_key
from service.web.render import CSP
from tests.web_support import add_job

API = "/api/v1"
NOT_JSON = "Content-Type: must be application/json, even with no body (got {})"
FOREIGN = "cross-site request refused: Origin 'https://evil.example' is not this server"


def make_settings(tmp_path: Path, **fields: Any) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'c.db'}",
        data_dir=tmp_path / "data",
        cache_dir=tmp_path / "cache",
        reap_interval_s=0,
        trusted_hosts=["testserver", "127.0.0.1"],
        **fields,
    )


@contextmanager
def app_client(settings: Settings, **kw: Any) -> Iterator[TestClient]:
    with TestClient(create_app(settings), follow_redirects=False, **kw) as client:
        yield client


def status_of(settings: Settings, job_id: int) -> str:
    with Session(get_engine(settings.effective_database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.status


# --------------------------------------------------------------------------- row 3: CSRF


def test_a_cross_site_form_post_cancels_and_reruns_nothing(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)  # no tokens: the README's `serve`
    with app_client(settings) as client:
        job = add_job(settings.effective_database_url, JobStatus.RUNNING)
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for action in ("cancel", "again"):
            # A form with no fields, and a no-cors fetch with no body (no content type).
            r = client.post(f"{API}/jobs/{job}/{action}", headers=form)
            assert (r.status_code, r.json()["detail"]) == (
                415,
                NOT_JSON.format("application/x-www-form-urlencoded"),
            )
            r = client.post(f"{API}/jobs/{job}/{action}")
            assert (r.status_code, r.json()["detail"]) == (415, NOT_JSON.format("none"))
            # JSON, but another site's page sent it.
            r = client.post(
                f"{API}/jobs/{job}/{action}", json={}, headers={"Origin": "https://evil.example"}
            )
            assert (r.status_code, r.json()["detail"]) == (403, FOREIGN)
            r = client.post(
                f"{API}/jobs/{job}/{action}", json={}, headers={"Sec-Fetch-Site": "cross-site"}
            )
            assert r.status_code == 403
            assert r.json()["detail"] == "cross-site request refused (Sec-Fetch-Site: cross-site)"
        # A text/plain "JSON" submission (a form's enctype) is refused before it is parsed.
        r = client.post(f"{API}/jobs", content=b"{}", headers={"Content-Type": "text/plain"})
        assert (r.status_code, r.json()["detail"]) == (415, NOT_JSON.format("text/plain"))
        assert status_of(settings, job) == JobStatus.RUNNING.value
        assert client.get(f"{API}/jobs").json()["total"] == 1  # nothing run again
        # The same request from the CLI, or from this server's own page, goes through.
        own = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
        r = client.post(f"{API}/jobs/{job}/cancel", json=None, headers=own | JSON_HEADER)
        assert r.status_code == 200, r.text
        assert status_of(settings, job) == JobStatus.CANCELLED.value


JSON_HEADER = {"Content-Type": "application/json"}


def test_runner_routes_and_token_holders_obey_the_same_rule(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with app_client(settings) as client:
        r = client.post(f"{API}/runners/r-1/lease", params={"wait": 0})
        assert (r.status_code, r.json()["detail"]) == (415, NOT_JSON.format("none"))
        r = client.post(
            f"{API}/runners", json={"name": "x"}, headers={"Origin": "https://evil.example"}
        )
        assert (r.status_code, r.json()["detail"]) == (403, FOREIGN)
        # A bodyless DELETE needs no content type (browsers preflight it): the route answers.
        assert client.delete(f"{API}/runners/r-nobody").status_code != 415
    tokens = make_settings(tmp_path / "t", api_tokens="alice:tok-alice")
    with app_client(tokens) as client:
        job = add_job(tokens.effective_database_url, JobStatus.RUNNING, owner="alice")
        bearer = {"Authorization": "Bearer tok-alice"}
        r = client.post(f"{API}/jobs/{job}/cancel", headers=bearer)
        assert (r.status_code, r.json()["detail"]) == (415, NOT_JSON.format("none"))
        r = client.post(
            f"{API}/jobs/{job}/cancel", headers=bearer | JSON_HEADER | {"Origin": "null"}
        )
        assert r.status_code == 403
        assert r.json()["detail"] == "cross-site request refused: Origin 'null' is not this server"
        assert status_of(tokens, job) == JobStatus.RUNNING.value


def test_the_client_sends_json_on_bodyless_posts() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": 7})

    with ApiClient("http://127.0.0.1:9", transport=httpx.MockTransport(answer)) as client:
        client.cancel(7)
        client.get_job(7)
    cancel, get = seen
    assert cancel.method == "POST" and cancel.headers["content-type"] == "application/json"
    assert "content-type" not in get.headers


def test_the_page_refuses_what_the_api_refuses(tmp_path: Path) -> None:
    """The web forms' rule is the API's: Sec-Fetch-Site cross-site fails even with the
    right CSRF token (before, only a foreign Origin did)."""
    settings = make_settings(tmp_path)
    with app_client(settings) as client:
        job = add_job(settings.effective_database_url, JobStatus.RUNNING)
        client.get("/login")
        token = client.cookies["lb_csrf"]
        cross = {"Sec-Fetch-Site": "cross-site"}
        r = client.post(f"/jobs/{job}/cancel", data={"csrf": token}, headers=cross)
        assert r.status_code == 403
        assert status_of(settings, job) == JobStatus.RUNNING.value
        r = client.post(f"/jobs/{job}/cancel", data={"csrf": token})
        assert r.status_code == 303


# --------------------------------------------------------------------------- row 4: sessions

TOKENS = {
    "api_tokens": "alice:tok-alice",
    "admin_tokens": "root:tok-admin",
    "view_tokens": "watcher:tok-view",
}


def log_in(client: TestClient, token: str) -> httpx.Response:
    client.get("/login")
    return client.post("/login", data={"csrf": client.cookies["lb_csrf"], "token": token})


def cancel_form(client: TestClient, job: int) -> httpx.Response:
    return client.post(f"/jobs/{job}/cancel", data={"csrf": client.cookies["lb_csrf"]})


def test_the_secret_is_made_once_0600_and_not_from_the_tokens(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, **TOKENS)
    with app_client(settings) as client:
        key = settings.data_dir / KEY_FILE
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
        first = key.read_bytes()
        assert log_in(client, "tok-admin").status_code == 303
        cookie = client.cookies["lb_session"]
    with app_client(settings) as again:  # a restart: the same key, the same session
        assert key.read_bytes() == first
        again.cookies.set("lb_session", cookie)
        assert again.get("/").status_code == 200


def _old_style_cookie(tokens: list[str], token: str, role: str, name: str) -> str:
    """A cookie as the code before issue 26 signed it: with a key made of the tokens."""
    digest = hashlib.sha256(b"leakbisect web session\0")
    for t in sorted(tokens):
        digest.update(t.encode() + b"\0")
    payload = json.dumps(
        {
            "role": role,
            "name": name,
            "exp": int(time.time()) + 3600,
            "tok": hashlib.sha256(token.encode()).hexdigest(),
        },
        sort_keys=True,
    ).encode()
    mac = hmac.new(digest.digest(), payload, hashlib.sha256).hexdigest()
    return base64.urlsafe_b64encode(payload).decode().rstrip("=") + "." + mac


def test_knowing_the_tokens_mints_no_session(tmp_path: Path) -> None:
    """A deployment with a single web token: its holder cannot make itself admin."""
    settings = make_settings(tmp_path, view_tokens="watcher:tok-view")
    with app_client(settings) as client:
        job = add_job(settings.effective_database_url, JobStatus.RUNNING)
        client.get("/login")
        client.cookies.set(
            "lb_session", _old_style_cookie(["tok-view"], "tok-view", "admin", "root")
        )
        assert client.get("/").status_code == 303  # to /login: no session
        assert cancel_form(client, job).status_code == 401
        assert status_of(settings, job) == JobStatus.RUNNING.value


def test_a_moved_or_removed_token_changes_its_sessions_at_once(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, **TOKENS)
    with app_client(settings) as client:
        url = settings.effective_database_url
        first, second = add_job(url, JobStatus.RUNNING), add_job(url, JobStatus.RUNNING)
        assert log_in(client, "tok-admin").status_code == 303
        # The operator moves the admin token to the view list.
        client.app.state.settings = make_settings(  # type: ignore[attr-defined]
            tmp_path, api_tokens="alice:tok-alice", view_tokens="root:tok-admin,watcher:tok-view"
        )
        r = cancel_form(client, first)
        assert r.status_code == 403 and "a view token can only read" in r.text
        assert status_of(settings, first) == JobStatus.RUNNING.value
        # ... and then removes it.
        client.app.state.settings = make_settings(tmp_path, api_tokens="alice:tok-alice")  # type: ignore[attr-defined]
        assert cancel_form(client, second).status_code == 401
        assert client.get("/").headers["location"] == "/login?next=/"


def test_a_configured_secret_is_shared_and_a_short_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s" * 40
    one = make_settings(tmp_path / "one", secret_key=secret, **TOKENS)
    two = make_settings(tmp_path / "two", secret_key=secret, **TOKENS)
    with app_client(one) as a, app_client(two) as b:
        assert log_in(a, "tok-alice").status_code == 303
        b.cookies.set("lb_session", a.cookies["lb_session"])
        assert b.get("/").status_code == 200
        assert not (one.data_dir / KEY_FILE).exists()
    other = make_settings(tmp_path / "two", secret_key="t" * 40, **TOKENS)
    with app_client(other) as c:
        c.cookies.set("lb_session", a.cookies["lb_session"])
        assert c.get("/").status_code == 303
    monkeypatch.setenv("BISECT_SECRET_KEY", "too-short")
    get_settings.cache_clear()
    try:
        with pytest.raises(Exception) as refused:
            get_settings()
    finally:
        get_settings.cache_clear()
    assert str(refused.value) == (
        "BISECT_SECRET_KEY: at least 32 characters, e.g. from "
        "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    )


def test_cookies_are_secure_when_the_operator_says_so(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, secure_cookies=True, **TOKENS)
    with app_client(settings) as client:
        page = client.get("/login")
        assert "secure" in page.headers["set-cookie"].lower()
        # Over http the client keeps no Secure cookie: send the CSRF token by hand.
        token = page.headers["set-cookie"].split("lb_csrf=", 1)[1].split(";", 1)[0]
        r = client.post(
            "/login",
            data={"csrf": token, "token": "tok-alice"},
            headers={"Cookie": f"lb_csrf={token}"},
        )
        assert r.status_code == 303
        session = [c for c in r.headers.get_list("set-cookie") if c.startswith("lb_session=")]
        assert len(session) == 1 and "; secure" in session[0].lower()
    plain = make_settings(tmp_path / "plain", **TOKENS)
    with app_client(plain) as client:
        assert "secure" not in client.get("/login").headers["set-cookie"].lower()


def test_serve_believes_forwarded_headers_from_the_configured_proxies(tmp_path: Path) -> None:
    from service.cli.serve import _Api

    settings = make_settings(tmp_path, forwarded_allow_ips="10.0.0.5", **TOKENS)
    with socket.socket() as sock:
        api = _Api(settings, sock, workers=1)
        assert api.server is not None
        assert api.server.config.forwarded_allow_ips == "10.0.0.5"


def test_login_guesses_are_throttled_per_address(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, login_free_failures=3, **TOKENS)
    with app_client(settings, client=("198.51.100.7", 4000)) as client:
        for _ in range(3):
            assert log_in(client, "guess").status_code == 401
        r = log_in(client, "tok-admin")  # the right token: not even compared now
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert (
            "too many failed logins from 198.51.100.7: try again in 1 s (after 3 failures in "
            "a row the wait starts at 1 s and doubles with each, up to 300 s: "
            "BISECT_LOGIN_FREE_FAILURES, BISECT_LOGIN_MAX_DELAY_S)"
        ) in r.text
        assert "lb_session" not in client.cookies
        # Another address is not held up by this one.
        throttle = client.app.state.login_throttle  # type: ignore[attr-defined]
        assert throttle.wait_s("203.0.113.9", time.monotonic()) == 0
        time.sleep(1.1)
        assert log_in(client, "tok-admin").status_code == 303


def test_the_wait_doubles_up_to_the_cap_and_a_success_forgets() -> None:
    throttle = LoginThrottle(free=2, max_delay_s=10)
    waits = []
    for i in range(8):
        throttle.failed("a", now=100.0 + i)
        waits.append(throttle.wait_s("a", now=100.0 + i))
    assert waits == [0, 1, 2, 4, 8, 10, 10, 10]
    throttle.succeeded("a")
    assert throttle.wait_s("a", now=107.0) == 0
    for _ in range(LoginThrottle.MAX_ADDRESSES + 5):  # bounded memory
        throttle.failed(os.urandom(8).hex(), now=200.0)
    assert len(throttle.failures) == LoginThrottle.MAX_ADDRESSES


# --------------------------------------------------------------------------- row 9


def test_docs_have_the_pages_headers_and_no_cdn(tmp_path: Path) -> None:
    with app_client(make_settings(tmp_path)) as client:
        docs = client.get("/docs")
        assert docs.status_code == 200
        assert docs.headers["content-security-policy"] == CSP
        assert docs.headers["x-frame-options"] == "DENY"
        assert "<script" not in docs.text and "cdn" not in docs.text.lower()
        assert "POST /api/v1/jobs/{job_id}/cancel" in docs.text
        assert client.get("/redoc").status_code == 404


@contextmanager
def live(app: FastAPI) -> Iterator[str]:
    """The app under uvicorn on a loopback port, for streams (the TestClient buffers them)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _touch(url: str, job: int) -> None:
    with Session(get_engine(url)) as session:
        session.execute(update(Job).where(Job.id == job).values(updated_at=utcnow()))  # type: ignore[arg-type]
        session.commit()


class Reader(threading.Thread):
    """Reads a stream's lines as they come, with the time each came."""

    def __init__(self, base: str, path: str, cookies: httpx.Cookies) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base, cookies=cookies, timeout=30)
        self.path, self.lines, self.status = path, [], 0
        self.lines: list[tuple[float, str]] = []

    def run(self) -> None:
        try:
            with self.client.stream("GET", self.path) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    self.lines.append((time.monotonic(), line))
        except httpx.HTTPError:
            pass


def test_the_list_stream_tells_a_client_only_of_its_own_jobs(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, api_tokens="alice:tok-alice,bob:tok-bob")
    app = create_app(settings)
    url = settings.effective_database_url
    with live(app) as base:
        mine = add_job(url, JobStatus.RUNNING, owner="alice")
        theirs = add_job(url, JobStatus.RUNNING, owner="bob")
        browser = httpx.Client(base_url=base, timeout=30)
        browser.get("/login")
        browser.post("/login", data={"csrf": browser.cookies["lb_csrf"], "token": "tok-alice"})
        reader = Reader(base, "/events", browser.cookies)
        reader.start()
        time.sleep(2.5)  # connected, and the watcher has its first look
        _touch(url, theirs)
        time.sleep(2.5)
        told = time.monotonic()
        _touch(url, mine)
        time.sleep(2.5)
        reader.client.close()
        events = [(t, line) for t, line in reader.lines if line == "data: jobs changed"]
        assert reader.status == 200
        assert events and all(t > told for t, _ in events), reader.lines


def test_a_client_holds_at_most_max_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A closed stream is noticed at its next write: a keepalive each second, not 15 s.
    monkeypatch.setattr(events, "KEEPALIVE_S", 1.0)
    settings = make_settings(tmp_path, max_streams=2)
    app = create_app(settings)
    with live(app) as base:
        readers = [Reader(base, "/events", httpx.Cookies()) for _ in range(2)]
        for reader in readers:
            reader.start()
        time.sleep(1)
        assert [r.status for r in readers] == [200, 200]
        third = httpx.get(f"{base}/events", timeout=10)
        assert (third.status_code, third.text) == (
            429,
            "too many live streams: at most 2 per client at once (BISECT_MAX_STREAMS); "
            "close a page or wait for one to end",
        )
        assert third.headers["retry-after"] == "3"
        readers[0].client.close()  # the browser goes away: its place is given back
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if app.state.web_watcher.open.get("127.0.0.1", 0) < 2:
                break
            time.sleep(0.2)
        assert app.state.web_watcher.open["127.0.0.1"] == 1
        readers[1].client.close()


def test_an_empty_secret_is_none_and_an_unwritable_data_dir_is_one_line(tmp_path: Path) -> None:
    # compose passes BISECT_SECRET_KEY as `${BISECT_SECRET_KEY:-}`: empty means unset.
    assert make_settings(tmp_path, secret_key="").secret_key is None
    # An API container's user may have no writable home: the start fails with one line.
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    data_dir = locked / "data"
    if os.geteuid() == 0:  # root writes anywhere: a file where the directory should be
        data_dir = tmp_path / "file" / "data"
        (tmp_path / "file").write_text("")
    settings = make_settings(tmp_path).model_copy(update={"data_dir": data_dir})
    with pytest.raises(InvalidInput) as refused:
        session_key(settings)
    assert str(refused.value).startswith(f"cannot keep the session key in {settings.data_dir}")
    assert str(refused.value).endswith(
        ": set BISECT_SECRET_KEY (32+ characters) or BISECT_DATA_DIR to a directory this user "
        "can write"
    )
