"""The API against a hostile client (issue 7): bad input, oversized bodies, other tokens'
jobs, requests that would make the server build or read what a job names.

Every case here was accepted, answered 500 or read whole on the service before the
trust-boundary work; each must now be a clear 4xx with the field named.
"""

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from service.app import create_app
from service.cli.serve import bind
from service.settings import Settings

API = "/api/v1"
ALICE, BOB, ADMIN, VIEWER, RUNNER = "alice-tok", "bob-tok", "admin-tok", "viewer-tok", "run-tok"


def settings(tmp_path: Path, **fields: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp_path / 'hostile.db'}",
        "data_dir": tmp_path,
        "cache_dir": tmp_path / "cache",
        "reap_interval_s": 0,
        "trusted_hosts": ["testserver"],
        "allowed_indexes": ["127.0.0.1"],
        **fields,
    }
    return Settings(**values)


def tokens() -> dict[str, str]:
    return {
        "api_tokens": f"alice:{ALICE},bob:{BOB}",
        "admin_tokens": f"ops:{ADMIN}",
        "view_tokens": f"wall:{VIEWER}",
        "runner_tokens": RUNNER,
    }


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def open_client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path))) as client:
        yield client


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path, **tokens()))) as client:
        yield client


def job_body(index: str, **overrides: Any) -> dict[str, Any]:
    return {
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "script": "pass",
        "index_url": index,
        **overrides,
    }


# --------------------------------------------------------------------- bad input

BAD_JOBS: list[tuple[dict[str, Any], str]] = [
    ({"memory_limit": 10**30}, "memory_limit: 1000000000000000000000000000000 is outside"),
    ({"memory_limit": "1"}, "memory_limit: '1' is outside 16MiB..1PiB"),
    ({"memory_limit": -5}, "memory_limit: -5 is not a positive size"),
    ({"memory_limit": 1.5}, "memory_limit: 1.5 is not a positive size"),
    ({"memory_limit": True}, "memory_limit: True is not a positive size"),
    ({"memory_limit": "12X"}, "memory_limit: '12X' is not a positive size"),
    ({"index_url": "http://[::1"}, "index_url: 'http://[::1' is not a URL"),
    ({"index_url": "ftp://example.org/simple"}, "index_url: 'ftp://example.org/simple' is not an"),
    ({"index_url": "file:///etc"}, "index_url: 'file:///etc' is not an http(s) URL"),
    ({"index_url": "http://:80/simple"}, "index_url: 'http://:80/simple' is not an http(s) URL"),
    ({"extra_index_urls": ["javascript:alert(1)"]}, "extra_index_urls: 'javascript:alert(1)'"),
    ({"find_links": ["/etc"]}, "find_links: '/etc' is not an http(s) URL"),
    ({"webhook_url": "javascript:alert(1)"}, "webhook_url: webhook javascript:alert(1): only "),
    ({"webhook_url": "http://:80/hook"}, "webhook_url: webhook 'http://:80/hook': the URL has"),
    ({"webhook_url": "x" * 2001}, "webhook_url: String should have at most 2000 characters"),
    ({"find_links": ["file:///etc"]}, "find_links: 'file:///etc' is not an http(s) URL"),
    ({"python": "foo"}, "python: 'foo' is not a Python version"),
    ({"python": "3.99"}, "python: '3.99': no CPython 3.99; write 3.8 to 3.20"),
    ({"python": "2.7"}, "python: '2.7' is not a Python version"),
    ({"python": "--index-url=http://x 3.11"}, "python: '--index-url=http://x 3.11' is not"),
    ({"script_name": "../../x.py"}, "script_name: '../../x.py' is not a plain file name"),
    ({"script_name": ""}, "script_name: '' is not a plain file name"),
    ({"script_name": "x.sh"}, "script_name: 'x.sh' is not a plain file name"),
    ({"resolve_at": "yesterday"}, "resolve_at: 'yesterday' is not a date: write YYYY-MM-DD"),
    ({"resolve_at": "2024-01-01" * 5}, "resolve_at: String should have at most 40 characters"),
    (
        {"resolve_at": "latest", "as_released": True},
        "resolve_at: cannot be combined with as released",
    ),
    ({"min_growth_fraction": 1e999}, "min_growth_fraction: Input should be a finite number"),
    ({"min_growth_mib": float("nan")}, "min_growth_mib: Input should be a finite number"),
    ({"min_growth_mib": 0}, "min_growth_mib: Input should be greater than 0"),
    ({"min_growth_fraction": -1}, "min_growth_fraction: Input should be greater than or equal"),
    ({"requirements": ["x @ file:///etc"]}, "requirements: 'x @ file:///etc' is a direct"),
    (
        {"requirements": ["pkg @ http://127.0.0.1:1/pkg-1.1.tar.gz"]},
        "requirements: 'pkg @ http://127.0.0.1:1/pkg-1.1.tar.gz' is a direct reference",
    ),
    ({"requirements": ["p @ git+https://example.org/p"]}, "requirements: 'p @ git+https://"),
    ({"requirements": ["foo>="]}, "requirements: requirement 'foo>=' does not parse"),
    ({"requirements": ["x"] * 201}, "requirements: at most 200 requirements, got 201"),
    ({"requirements": ["x" * 2001]}, "requirements: an entry is longer than 2000 characters"),
    ({"extra_index_urls": ["http://a"] * 21}, "extra_index_urls: at most 20 entries, got 21"),
    ({"package": ""}, "package: missing; name the package whose releases to bisect"),
    ({"package": "a" * 201}, "package: String should have at most 200 characters"),
    ({"package": "not a name!"}, "package: 'not a name!' is not a package name"),
    ({"range": "1.0.0"}, "range: '1.0.0' is not a range"),
    ({"range": "1" * 100 + ".." + "2" * 101}, "range: String should have at most 200 characters"),
    ({"repeats": 0}, "repeats: Input should be greater than or equal to 1"),
    ({"repeats": 21}, "repeats: Input should be less than or equal to 20"),
    ({"repeats": "many"}, "repeats: Input should be a valid integer"),
    ({"max_runs": 21}, "max_runs: Input should be less than or equal to 20"),
    ({"timeout_s": 0}, "timeout_s: Input should be greater than 0"),
    ({"timeout_s": 1e9}, "timeout_s: Input should be less than or equal to 86400"),
    ({"sample_hz": 1000}, "sample_hz: Input should be less than or equal to 100"),
    ({"script": "   "}, "script: the script is empty"),
    ({"variables": {"BISECT_API_TOKENS": "x"}}, "variables: BISECT_API_TOKENS: BISECT_* vari"),
    ({"variables": {"1X": "y"}}, "variables: '1X' is not a variable name"),
    ({"variables": {f"V{i}": "x" for i in range(65)}}, "variables: at most 64 variables, got 65"),
    ({"variables": {"V": "x" * 5000}}, "variables: V: a value is at most 4096 bytes"),
    ({"repeat": 3}, "repeat: Extra inputs are not permitted"),
]


@pytest.mark.parametrize(("fields", "fragment"), BAD_JOBS)
def test_bad_job_fields_are_422_naming_the_field(
    client: TestClient, fixture_index: str, fields: dict[str, Any], fragment: str
) -> None:
    # json.dumps writes Infinity and NaN, which the server's JSON parser reads as floats.
    body = json.dumps(job_body(fixture_index, **fields))
    headers = {**auth(ALICE), "Content-Type": "application/json"}
    response = client.post(f"{API}/jobs", content=body, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(fragment), response.json()["detail"]


BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    ("GET", f"/jobs/{2**64}", None, 404, f"job {2**64} not found"),
    ("GET", "/jobs/-1", None, 404, "job -1 not found"),
    ("GET", "/jobs/abc", None, 422, "job_id: Input should be a valid integer"),
    ("GET", f"/trials/{2**64}", None, 404, f"trial {2**64} not found"),
    ("GET", f"/trials/{2**64}/samples", None, 404, f"trial {2**64} not found"),
    ("POST", f"/jobs/{2**64}/cancel", None, 404, f"job {2**64} not found"),
    ("GET", "/jobs?limit=0", None, 422, "limit: Input should be greater than or equal to 1"),
    ("GET", "/jobs?limit=10000", None, 422, "limit: Input should be less than or equal to 500"),
    ("GET", "/jobs?offset=-1", None, 422, "offset: Input should be greater than or equal to 0"),
    ("GET", "/jobs?status=bogus", None, 422, "status: Input should be 'queued'"),
    ("POST", "/jobs", b"{not json", 422, "body: invalid JSON"),
    ("POST", "/jobs", b"[1, 2]", 422, "body: Input should be a valid dictionary"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "fragment"), BAD_REQUESTS)
def test_bad_requests_are_4xx_never_500(
    client: TestClient, method: str, path: str, body: Any, status: int, fragment: str
) -> None:
    headers = {**auth(ALICE), "Content-Type": "application/json"}
    response = client.request(method, API + path, content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["detail"].startswith(fragment), response.json()["detail"]


def test_more_than_forty_bad_inputs_are_covered() -> None:
    assert len(BAD_JOBS) + len(BAD_REQUESTS) >= 40


# ------------------------------------------------------------------- the server never builds


def test_submission_builds_nothing_on_the_server(
    client: TestClient, tmp_path: Path, fixture_index: str
) -> None:
    """A requirement that only exists as an sdist would run its build backend during
    resolution; resolution happens in a resolve trial on a runner, not at submission."""
    from tests.sdist import evil_sdist_index

    marker = tmp_path / "built-on-the-server"
    with evil_sdist_index(tmp_path / "evil", marker) as evil:
        body = job_body(fixture_index, requirements=["evilbuild"], extra_index_urls=[evil])
        response = client.post(f"{API}/jobs", json=body, headers=auth(ALICE))
        assert response.status_code == 201, response.text
    assert not marker.exists()


# ------------------------------------------------------------------------- bodies


def _serve(app_settings: Settings) -> tuple[uvicorn.Server, threading.Thread, int]:
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(app_settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    return server, thread, sock.getsockname()[1]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[int]:
    server, thread, port = _serve(settings(tmp_path, **tokens(), trusted_hosts=["127.0.0.1"]))
    yield port
    server.should_exit = True
    thread.join(10)


def send_chunked(port: int, path: str, token: str | None, megabytes: int) -> tuple[str, int]:
    """POST a chunked body of up to `megabytes` MiB, one MiB at a time, stopping as soon as
    an answer comes; (its status line, the MiB sent by then)."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
    head += "Content-Type: application/json\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
    sent = 0
    try:
        conn.sendall((head + "\r\n").encode())
        while sent < megabytes and not select.select([conn], [], [], 0.01)[0]:
            conn.sendall(chunk)
            sent += 1
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed the connection: read what it said
    try:
        answer = conn.recv(4096)
    finally:
        conn.close()
    return answer.split(b"\r\n", 1)[0].decode(), sent


def test_a_body_without_a_token_is_refused_unread(live: int) -> None:
    for path in (f"{API}/jobs", f"{API}/runners"):
        status, sent = send_chunked(live, path, None, 150)
        assert status == "HTTP/1.1 401 Unauthorized"
        assert sent < 150  # answered long before the 150 MiB were sent


def test_a_chunked_body_past_the_limit_is_413(live: int) -> None:
    status, sent = send_chunked(live, f"{API}/jobs", ALICE, 150)
    assert status == "HTTP/1.1 413 Request Entity Too Large"
    assert sent < 150
    status, _ = send_chunked(live, f"{API}/runners", RUNNER, 150)
    assert status == "HTTP/1.1 413 Request Entity Too Large"


def test_content_length_past_the_limit_is_413(client: TestClient) -> None:
    response = client.post(
        f"{API}/jobs", content=b"x" * (9 << 20), headers={**auth(ALICE), "Content-Type": "json"}
    )
    assert (response.status_code, response.json()) == (
        413,
        {"detail": "script: the request is larger than 8 MiB"},
    )


# ------------------------------------------------------------------------- owners


def submit(client: TestClient, index: str, token: str) -> int:
    response = client.post(f"{API}/jobs", json=job_body(index), headers=auth(token))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_a_token_reads_and_cancels_its_own_jobs_only(
    client: TestClient, fixture_index: str
) -> None:
    mine, theirs = submit(client, fixture_index, ALICE), submit(client, fixture_index, BOB)
    listed = client.get(f"{API}/jobs", headers=auth(ALICE)).json()
    assert [(j["id"], j["owner"]) for j in listed["items"]] == [(mine, "alice")]
    assert client.get(f"{API}/jobs/{theirs}", headers=auth(ALICE)).status_code == 404
    assert (
        client.post(f"{API}/jobs/{theirs}/cancel", json={}, headers=auth(ALICE)).status_code == 404
    )
    assert client.get(f"{API}/trials/2", headers=auth(ALICE)).status_code == 404  # bob's trial
    assert client.get(f"{API}/trials/1", headers=auth(ALICE)).status_code == 200

    everything = client.get(f"{API}/jobs", headers=auth(VIEWER)).json()["items"]
    assert [j["id"] for j in everything] == [theirs, mine]
    refused = client.post(f"{API}/jobs/{mine}/cancel", json={}, headers=auth(VIEWER))
    assert (refused.status_code, refused.json()) == (403, {"detail": "a view token can only read"})
    assert (
        client.post(f"{API}/jobs", json=job_body(fixture_index), headers=auth(VIEWER)).status_code
        == 403
    )

    assert (
        client.post(f"{API}/jobs/{theirs}/cancel", json={}, headers=auth(ADMIN)).status_code == 200
    )
    assert client.post(f"{API}/jobs/{mine}/cancel", json={}, headers=auth(ALICE)).status_code == 200


# --------------------------------------------------------------------------- hosts


def test_with_no_tokens_only_loopback_host_names_are_served(open_client: TestClient) -> None:
    evil = open_client.get(f"{API}/jobs", headers={"Host": "rebind.example.com"})
    assert evil.status_code == 400
    assert evil.json()["detail"].startswith("Host rebind.example.com is not served")
    assert open_client.get(f"{API}/jobs", headers={"Host": "testserver"}).status_code == 200


def test_loopback_hosts_pass_the_check(tmp_path: Path) -> None:
    app_settings = settings(tmp_path)
    app_settings = app_settings.model_copy(
        update={"trusted_hosts": ["127.0.0.1", "localhost", "::1"]}
    )
    with TestClient(create_app(app_settings), base_url="http://127.0.0.1:8000") as client:
        assert client.get(f"{API}/jobs").status_code == 200
        assert client.get(f"{API}/jobs", headers={"Host": "localhost:8000"}).status_code == 200
        assert client.get(f"{API}/jobs", headers={"Host": "[::1]:8000"}).status_code == 200
        assert client.get(f"{API}/jobs", headers={"Host": "127.0.0.2"}).status_code == 400


# ------------------------------------------------------------------------- indexes


def test_index_hosts_outside_the_allowlist_are_refused(tmp_path: Path, fixture_index: str) -> None:
    app_settings = settings(tmp_path, **tokens(), allowed_indexes=["pypi.org"])
    with TestClient(create_app(app_settings)) as client:
        response = client.post(f"{API}/jobs", json=job_body(fixture_index), headers=auth(ALICE))
    assert response.status_code == 422
    assert response.json()["detail"] == (
        f"index_url: index {fixture_index}: host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES"
    )


def test_private_index_hosts_are_refused_by_default(tmp_path: Path, fixture_index: str) -> None:
    app_settings = settings(tmp_path, **tokens(), allowed_indexes=[])
    with TestClient(create_app(app_settings)) as client:
        response = client.post(f"{API}/jobs", json=job_body(fixture_index), headers=auth(ALICE))
    assert response.status_code == 422
    assert response.json()["detail"] == (
        f"index_url: index {fixture_index}: host 127.0.0.1 is not a public address "
        "(list it in BISECT_ALLOWED_INDEXES)"
    )
