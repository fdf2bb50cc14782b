"""The API client: retries (network errors and 5xx only), one-line errors, no token leaks."""

import socket

import httpx
import pytest

from contract.wire import EnvResult, Heartbeat, LeaseReturn, RunnerRegister, TrialReport
from runners.client import ApiClient, ApiError, ApiUnreachable, StaleLeaseError, api_root

TOKEN = "s3cret-token-value"


def client_for(handler, **kw) -> tuple[ApiClient, list[float]]:
    sleeps: list[float] = []
    client = ApiClient(
        "http://api.test",
        TOKEN,
        transport=httpx.MockTransport(handler),
        sleep=sleeps.append,
        **kw,
    )
    return client, sleeps


def test_api_root() -> None:
    assert api_root("http://h:8000") == "http://h:8000/api/v1"
    assert api_root("http://h:8000/") == "http://h:8000/api/v1"
    assert api_root("http://h:8000/api/v1/") == "http://h:8000/api/v1"
    assert api_root("h:8000") == "http://h:8000/api/v1"


def test_retries_5xx_and_network_errors_then_succeeds() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) == 1:
            raise httpx.ConnectError("Connection refused", request=request)
        if len(calls) == 2:
            return httpx.Response(503, json={"detail": "starting"})
        if len(calls) == 3:
            raise httpx.ReadTimeout("timed out", request=request)
        if len(calls) == 4:
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        return httpx.Response(200, json={"id": 7, "status": "running"})

    client, sleeps = client_for(handler, backoff=0.5)
    assert client.get_job(7) == {"id": 7, "status": "running"}
    assert calls == ["/api/v1/jobs/7"] * 5
    assert sleeps == [0.5, 1.0, 2.0, 4.0]  # exponential backoff


def test_no_retry_on_4xx_one_line_error() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(
            422, json={"detail": "range: version 9.9 of leakyfixture does not exist\n(listed: 1)"}
        )

    client, sleeps = client_for(handler)
    with pytest.raises(ApiError) as info:
        client.submit({"package": "leakyfixture"})
    assert calls == 1 and sleeps == []
    assert info.value.status == 422
    text = str(info.value)
    assert text == "HTTP 422: range: version 9.9 of leakyfixture does not exist (listed: 1)"
    assert "\n" not in text


def test_fastapi_validation_list_detail_and_text_bodies() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/jobs"):
            return httpx.Response(
                422,
                json={"detail": [{"loc": ["body", "range"], "msg": "Field required"}]},
            )
        return httpx.Response(404, text="Not Found")

    client, _ = client_for(handler)
    with pytest.raises(ApiError, match=r"^HTTP 422: range: Field required$"):
        client.submit({})
    with pytest.raises(ApiError, match=r"^HTTP 404: Not Found$"):
        client.get_trial(3)


def test_409_is_stale_lease() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"detail": "trial 3 was cancelled"})

    client, sleeps = client_for(handler)
    with pytest.raises(StaleLeaseError) as info:
        client.heartbeat(3, Heartbeat(runner_id="r-1", attempt=1, rss=10))
    assert isinstance(info.value, ApiError)
    assert str(info.value) == "HTTP 409: trial 3 was cancelled"
    assert sleeps == []


def test_5xx_gives_up_after_retries() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(500, json={"detail": "internal server error (OperationalError)"})

    client, sleeps = client_for(handler, retries=3, backoff=1.0)
    with pytest.raises(ApiError, match=r"^HTTP 500: internal server error"):
        client.list_jobs()
    assert calls == 4
    assert sleeps == [1.0, 2.0, 4.0]


def test_connection_refused_for_real_is_one_line_and_hides_the_token() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    sleeps: list[float] = []
    client = ApiClient(f"http://127.0.0.1:{port}", TOKEN, retries=2, sleep=sleeps.append)
    with pytest.raises(ApiUnreachable) as info:
        client.get_job(1)
    text = str(info.value)
    assert text.startswith(f"cannot reach http://127.0.0.1:{port}/api/v1/jobs/1: ConnectError")
    assert "\n" not in text and TOKEN not in text and TOKEN not in repr(client)
    assert len(sleeps) == 2


def test_runner_endpoints_shapes() -> None:
    seen: list[tuple[str, str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.url.query.decode()))
        if request.url.path.endswith("/lease"):
            return httpx.Response(204)
        if request.url.path.endswith("/complete"):
            return httpx.Response(200, json={"verdict": "clean"})
        return httpx.Response(200 if request.method != "DELETE" else 204)

    client, _ = client_for(handler)
    assert client.lease("r-1", wait=5) is None
    report = TrialReport(trial_id=4, attempt=2, runner_id="r-1", env=EnvResult(ok=True))
    assert client.complete(4, report) == {"verdict": "clean"}
    client.leave("r-1")
    assert seen == [
        ("POST", "/api/v1/runners/r-1/lease", "wait=5"),
        ("POST", "/api/v1/trials/4/complete", ""),
        ("DELETE", "/api/v1/runners/r-1", ""),
    ]


def test_the_runner_secret_goes_on_every_runner_request_and_nowhere_else() -> None:
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("X-Runner-Secret")))
        if request.url.path.endswith("/runners"):
            body = {"runner_id": "r-1", "runner_secret": "rs-42", "lease_s": 30, "heartbeat_s": 10}
            return httpx.Response(201, json=body)
        if request.url.path.endswith("/heartbeat"):
            return httpx.Response(200, json={"lease_expires_at": "2026-12-03T12:00:00Z"})
        return httpx.Response(204 if request.url.path.endswith("/lease") else 200, json={})

    client, _ = client_for(handler)
    client.register(RunnerRegister(name="x"))
    client.lease("r-1", wait=0)
    client.heartbeat(3, Heartbeat(runner_id="r-1", attempt=1))
    report = TrialReport(trial_id=3, runner_id="r-1", env=EnvResult(ok=True))
    client.complete(3, report)
    client.complete(3, report, secret="rs-spooled")  # a report spooled by an earlier runner
    client.give_back(3, LeaseReturn(runner_id="r-1", attempt=1))
    client.leave("r-1")
    client.get_job(1)
    assert seen == [
        ("/api/v1/runners", None),
        ("/api/v1/runners/r-1/lease", "rs-42"),
        ("/api/v1/trials/3/heartbeat", "rs-42"),
        ("/api/v1/trials/3/complete", "rs-42"),
        ("/api/v1/trials/3/complete", "rs-spooled"),
        ("/api/v1/trials/3/return", "rs-42"),
        ("/api/v1/runners/r-1", "rs-42"),
        ("/api/v1/jobs/1", None),
    ]
    assert "rs-42" not in repr(client)


def test_submit_retries_with_one_idempotency_key() -> None:
    keys: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers.get("Idempotency-Key"))
        if len(keys) < 3:
            raise httpx.ReadTimeout("slow", request=request)  # the answer is lost
        return httpx.Response(200, json={"id": 1, "url": "u", "status": "running"})

    client, sleeps = client_for(handler)
    assert client.submit({"package": "p"})["id"] == 1
    assert len(keys) == 3 and len(set(keys)) == 1 and keys[0] and len(sleeps) == 2
    client.submit({"package": "p"})
    assert keys[3] != keys[0]  # a new submission, a new key
