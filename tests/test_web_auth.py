"""The status page with tokens configured, against a real `serve`: the login form and its
signed HttpOnly SameSite=Strict cookie, roles (view reads only, API tokens see their own
jobs, admin all), CSRF on every POST, logout, and the same tokens on the API's report.md.
"""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.models import JobStatus
from tests.web_support import add_job, service_env, serving

TOKENS = {
    "BISECT_API_TOKENS": "alice:tok-alice,bob:tok-bob",
    "BISECT_ADMIN_TOKENS": "root:tok-admin",
    "BISECT_VIEW_TOKENS": "watcher:tok-view",
    "BISECT_RUNNER_TOKENS": "tok-runner",
}


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, reachable_dir: Any, uv_cache: Path
) -> Iterator[tuple[str, dict[str, int]]]:
    home = tmp_path_factory.mktemp("web-auth")
    env = service_env(home, reachable_dir, uv_cache, **TOKENS)
    url = f"sqlite:///{home / 'auth.db'}"
    ids = {
        "alice": add_job(url, JobStatus.RUNNING, owner="alice", package="alice-pkg"),
        "bob": add_job(url, JobStatus.RUNNING, owner="bob", package="bob-pkg"),
    }
    with serving(home, env, url) as svc:
        yield svc.url, ids


def browser(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=30)


def csrf(client: httpx.Client) -> str:
    client.get("/login")
    return client.cookies["lb_csrf"]


def logged_in(base: str, token: str) -> httpx.Client:
    client = browser(base)
    r = client.post("/login", data={"csrf": csrf(client), "token": token, "next": "/"})
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    return client


def rows(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="job-row-(\d+)">', html)]


def test_no_cookie_asks_to_log_in(secured: tuple[str, dict[str, int]]) -> None:
    base, ids = secured
    client = browser(base)
    page = client.get(f"/jobs/{ids['alice']}?candidate=1.0")
    assert page.status_code == 303
    assert page.headers["location"] == f"/login?next=/jobs/{ids['alice']}%3Fcandidate%3D1.0"
    for path in ("/fragments/jobs", "/events", f"/jobs/{ids['alice']}/report.md"):
        assert client.get(path).status_code == 401, path
    form = client.get("/login").text
    assert '<input id="token" name="token" type="password"' in form
    forged = browser(base)
    forged.cookies.set("lb_session", "eyJyb2xlIjoiYWRtaW4ifQ.deadbeef")
    assert forged.get("/").status_code == 303


def test_login_sets_a_strict_httponly_cookie(secured: tuple[str, dict[str, int]]) -> None:
    base, _ = secured
    client = browser(base)
    token = csrf(client)
    r = client.post("/login", data={"csrf": token, "token": "tok-view", "next": "//evil.example/"})
    assert r.status_code == 303 and r.headers["location"] == "/"  # never an open redirect
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("lb_session=") and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie and "Path=/" in cookie
    assert "tok-view" not in cookie


@pytest.mark.parametrize("token", ["wrong", "tok-runner", ""])
def test_bad_tokens_are_refused(secured: tuple[str, dict[str, int]], token: str) -> None:
    client = browser(secured[0])
    r = client.post("/login", data={"csrf": csrf(client), "token": token})
    assert r.status_code == 401
    assert "That token is not one of this server's API, admin or view tokens." in r.text
    assert "lb_session" not in client.cookies


def test_login_needs_csrf(secured: tuple[str, dict[str, int]]) -> None:
    client = browser(secured[0])
    r = client.post("/login", data={"token": "tok-admin"})
    assert r.status_code == 403 and "CSRF token missing or wrong" in r.text


def test_view_token_reads_everything_and_cancels_nothing(
    secured: tuple[str, dict[str, int]],
) -> None:
    base, ids = secured
    viewer = logged_in(base, "tok-view")
    listing = viewer.get("/").text
    assert sorted(rows(listing)) == sorted(ids.values())
    assert "watcher (view only)" in listing
    page = viewer.get(f"/jobs/{ids['bob']}").text
    assert 'id="cancel"' not in page and 'id="again"' not in page
    token = viewer.cookies["lb_csrf"]
    r = viewer.post(f"/jobs/{ids['bob']}/cancel", data={"csrf": token})
    assert r.status_code == 403 and "a view token can only read" in r.text
    assert "running" in viewer.get(f"/jobs/{ids['bob']}").text


def test_owners_see_their_own_jobs(secured: tuple[str, dict[str, int]]) -> None:
    base, ids = secured
    alice = logged_in(base, "tok-alice")
    assert rows(alice.get("/").text) == [ids["alice"]]
    assert alice.get(f"/jobs/{ids['bob']}").status_code == 404
    assert alice.get(f"/events/jobs/{ids['bob']}").status_code == 404
    token = alice.cookies["lb_csrf"]
    assert alice.post(f"/jobs/{ids['bob']}/cancel", data={"csrf": token}).status_code == 404
    assert 'id="cancel"' in alice.get(f"/jobs/{ids['alice']}").text


def test_admin_cancels_any_job_with_csrf(secured: tuple[str, dict[str, int]]) -> None:
    base, ids = secured
    admin = logged_in(base, "tok-admin")
    assert sorted(rows(admin.get("/").text)) == sorted(ids.values())
    assert admin.post(f"/jobs/{ids['bob']}/cancel", data={}).status_code == 403
    r = admin.post(f"/jobs/{ids['bob']}/cancel", data={"csrf": admin.cookies["lb_csrf"]})
    assert r.status_code == 303
    assert (
        '<span class="badge s-cancelled">cancelled</span>' in admin.get(f"/jobs/{ids['bob']}").text
    )


def test_logout_clears_the_session(secured: tuple[str, dict[str, int]]) -> None:
    base, _ = secured
    client = logged_in(base, "tok-admin")
    assert client.get("/").status_code == 200
    r = client.post("/logout", data={"csrf": client.cookies["lb_csrf"]})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert 'lb_session=""' in r.headers["set-cookie"]
    assert client.get("/").status_code == 303


def test_report_md_takes_the_api_tokens(secured: tuple[str, dict[str, int]]) -> None:
    base, ids = secured
    path = f"/api/v1/jobs/{ids['alice']}/report.md"
    assert httpx.get(base + path).status_code == 401
    view = httpx.get(base + path, headers={"Authorization": "Bearer tok-view"})
    assert view.status_code == 200 and view.text.startswith("### leakbisect: `alice-pkg` 1.0..1.3")
    bob = httpx.get(base + path, headers={"Authorization": "Bearer tok-bob"})
    assert bob.status_code == 404
    again = httpx.post(
        base + f"/api/v1/jobs/{ids['alice']}/again",
        json={},
        headers={"Authorization": "Bearer tok-view"},
    )
    assert again.status_code == 403 and again.json()["detail"] == "a view token can only read"
