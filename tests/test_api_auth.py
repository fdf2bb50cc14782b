"""Bearer-token auth: API tokens for clients, runner tokens for runners, nothing logged."""

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

API = "/api/v1"
CLIENT_TOKENS = ("client-secret-one", "client-secret-two")
RUNNER_TOKEN = "runner-secret-xyz"
SECRETS = (*CLIENT_TOKENS, RUNNER_TOKEN)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def settings(tmp_path: Path, **fields: object) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'auth.db'}",
        data_dir=tmp_path,
        cache_dir=tmp_path / "cache",
        reap_interval_s=0,
        trusted_hosts=["testserver"],  # the TestClient's Host (checked with no tokens)
        allowed_indexes=["127.0.0.1"],  # the fixture index (only public ones by default)
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uv_cache: Path) -> Iterator[TestClient]:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    # As an operator configures them: comma-separated environment variables.
    monkeypatch.setenv("BISECT_API_TOKENS", ",".join(CLIENT_TOKENS))
    monkeypatch.setenv("BISECT_RUNNER_TOKENS", RUNNER_TOKEN)
    with TestClient(create_app(settings(tmp_path))) as client:
        yield client


def job_body(index: str) -> dict[str, str]:
    return {
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "script": "pass",
        "index_url": index,
    }


def test_tokens_come_from_the_environment_and_stay_secret(client: TestClient) -> None:
    configured: Settings = client.app.state.settings  # type: ignore[attr-defined]
    assert [t.get_secret_value() for t in configured.api_tokens] == list(CLIENT_TOKENS)
    assert [t.get_secret_value() for t in configured.runner_tokens] == [RUNNER_TOKEN]
    assert not any(secret in repr(configured) for secret in SECRETS)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/jobs"),
        ("POST", "/jobs"),
        ("GET", "/jobs/1"),
        ("POST", "/jobs/1/cancel"),
        ("GET", "/trials/1"),
        ("GET", "/trials/1/samples"),
        ("POST", "/runners"),
        ("POST", "/runners/r-1/lease"),
        ("POST", "/trials/1/heartbeat"),
        ("POST", "/trials/1/complete"),
        ("POST", "/trials/1/return"),
        ("DELETE", "/runners/r-1"),
    ],
)
def test_missing_or_wrong_token_is_401(client: TestClient, method: str, path: str) -> None:
    for headers in ({}, bearer("not-a-token"), {"Authorization": f"Basic {RUNNER_TOKEN}"}):
        response = client.request(method, API + path, headers=headers)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["detail"] in (
            "missing bearer token (Authorization: Bearer TOKEN)",
            "invalid bearer token",
        )


def test_tokens_of_the_other_kind_are_403(client: TestClient, fixture_index: str) -> None:
    response = client.post(
        f"{API}/jobs", json=job_body(fixture_index), headers=bearer(RUNNER_TOKEN)
    )
    assert (response.status_code, response.json()) == (
        403,
        {"detail": "a runner token cannot be used on client endpoints"},
    )
    assert client.get(f"{API}/jobs", headers=bearer(RUNNER_TOKEN)).status_code == 403
    assert client.get(f"{API}/trials/1", headers=bearer(RUNNER_TOKEN)).status_code == 403
    for token in CLIENT_TOKENS:
        response = client.post(f"{API}/runners", json={"name": "x"}, headers=bearer(token))
        assert (response.status_code, response.json()) == (
            403,
            {"detail": "an API token cannot be used on runner endpoints"},
        )
        leased = client.post(f"{API}/runners/r-1/lease", json={}, headers=bearer(token))
        assert leased.status_code == 403
        response = client.post(
            f"{API}/trials/1/heartbeat",
            json={"runner_id": "r-1", "attempt": 1},
            headers=bearer(token),
        )
        assert response.status_code == 403


def test_the_right_tokens_work(client: TestClient, fixture_index: str) -> None:
    for token in CLIENT_TOKENS:
        response = client.post(f"{API}/jobs", json=job_body(fixture_index), headers=bearer(token))
        assert response.status_code == 201, response.text
        assert client.get(f"{API}/jobs", headers=bearer(token)).status_code == 200
    runner = client.post(f"{API}/runners", json={"name": "r"}, headers=bearer(RUNNER_TOKEN))
    assert runner.status_code == 201
    runner_id = runner.json()["runner_id"]
    # The runner token opens the endpoints; the runner's own secret says which runner it is.
    as_runner = bearer(RUNNER_TOKEN) | {"X-Runner-Secret": runner.json()["runner_secret"]}
    lease = client.post(
        f"{API}/runners/{runner_id}/lease", params={"wait": 0}, json={}, headers=as_runner
    )
    assert lease.status_code == 200
    trial = lease.json()["trial"]
    beat = client.post(
        f"{API}/trials/{trial['trial_id']}/heartbeat",
        json={"runner_id": runner_id, "attempt": trial["attempt"]},
        headers=as_runner,
    )
    assert beat.status_code == 200
    response = client.get(f"{API}/trials/{trial['trial_id']}", headers=bearer(CLIENT_TOKENS[0]))
    assert response.json()["runner_id"] == runner_id
    # The docs need no token.
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/docs").status_code == 200


def test_tokens_never_reach_the_logs(
    client: TestClient, fixture_index: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client.post(f"{API}/jobs", json=job_body(fixture_index), headers=bearer(CLIENT_TOKENS[1]))
    client.post(f"{API}/jobs", json={"script": "pass"}, headers=bearer(CLIENT_TOKENS[0]))
    client.get(f"{API}/jobs", headers=bearer(RUNNER_TOKEN))
    client.post(f"{API}/runners", json={"name": "r"}, headers=bearer(CLIENT_TOKENS[0]))
    client.post(f"{API}/runners", json={"name": "r"}, headers=bearer(RUNNER_TOKEN))
    client.get(f"{API}/jobs", headers=bearer(RUNNER_TOKEN + "-wrong"))
    assert caplog.records  # something was logged at all
    for secret in SECRETS:
        assert secret not in caplog.text


def test_no_tokens_at_all_means_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BISECT_API_TOKENS", raising=False)
    monkeypatch.delenv("BISECT_RUNNER_TOKENS", raising=False)
    with TestClient(create_app(settings(tmp_path))) as client:
        assert client.get(f"{API}/jobs").status_code == 200
        assert client.post(f"{API}/runners", json={"name": "r"}).status_code == 201


def test_runner_tokens_alone_close_the_client_endpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BISECT_API_TOKENS", raising=False)
    configured = settings(tmp_path, runner_tokens=RUNNER_TOKEN)
    with TestClient(create_app(configured)) as client:
        assert client.get(f"{API}/jobs").status_code == 401
        assert client.get(f"{API}/jobs", headers=bearer(RUNNER_TOKEN)).status_code == 403
        response = client.post(f"{API}/runners", json={"name": "r"}, headers=bearer(RUNNER_TOKEN))
        assert response.status_code == 201
