"""The runner protocol under attack and under faults, on SQLite and Postgres.

- Runners are authenticated as themselves: runner B, holding the same runner token, tries
  every runner endpoint on runner A's trial and gets 403 or 409 each time; A's result stands.
- A repeated `Idempotency-Key` returns the first job (200), per token.
- `GET /trials/{id}/samples` pages and downsamples.
- A report is classified with no lock held (instrumented, not timed).
"""

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlmodel import Session, select

from service.api.routes import runners as runner_routes
from service.db import get_engine
from service.models import Job, MemorySample
from tests import test_api
from tests.test_api import (
    API,
    MIB,
    as_runner,
    body,
    complete,
    heartbeat,
    lease,
    register,
    report,
    submit,
)

# test_api's fixtures: the same app on SQLite and on Postgres.
db_url = test_api.db_url
make_client = test_api.make_client
client = test_api.client


def settings_url(client: TestClient) -> str:
    return client.app.state.settings.effective_database_url  # type: ignore[attr-defined]


# ------------------------------------------------------------------ runner identity


def test_runner_b_cannot_act_for_runner_a(client: TestClient, fixture_index: str) -> None:
    a, b = register(client, "a"), register(client, "b")
    submit(client, fixture_index)
    held = lease(client, a)
    assert held is not None
    spec = held["trial"]
    trial_id, attempt = spec["trial_id"], spec["attempt"]
    assert spec["env"]["version"] == "1.0.0"  # clean in the fixture

    forged = report(held, a) | {  # a leak, 60 s at +8 MiB/s
        "samples": [{"t": i * 0.5, "rss": (500 + 4 * i) * MIB} for i in range(121)],
    }

    def post(path: str, json: Any, as_: str) -> Any:
        return client.post(f"{API}{path}", json=json, headers=as_runner(as_))

    beat_as_a = {"runner_id": a, "attempt": attempt, "rss": 1}
    beat_as_b = {"runner_id": b, "attempt": attempt, "rss": 1}
    not_a = f"runner_id: {a} is not the runner this X-Runner-Secret was issued to"
    not_ours = f"trial {trial_id} is held by another lease, not runner {b} attempt {attempt}"
    tries = [
        # B's secret, A's name: 403 before any lease is looked at.
        (post(f"/trials/{trial_id}/heartbeat", beat_as_a, b), 403, not_a),
        (post(f"/trials/{trial_id}/complete", forged, b), 403, not_a),
        (post(f"/trials/{trial_id}/return", {"runner_id": a, "attempt": attempt}, b), 403, not_a),
        (
            client.post(
                f"{API}/runners/{a}/lease", params={"wait": 0}, json={}, headers=as_runner(b)
            ),
            403,
            f"runner_id: {a} is not the runner this X-Runner-Secret was issued to",
        ),
        (client.delete(f"{API}/runners/{a}", headers=as_runner(b)), 403, not_a),
        # B's own name: the lease is not B's (and A is not named).
        (post(f"/trials/{trial_id}/heartbeat", beat_as_b, b), 409, not_ours),
        (post(f"/trials/{trial_id}/complete", forged | {"runner_id": b}, b), 409, not_ours),
        (post(f"/trials/{trial_id}/return", beat_as_b, b), 409, not_ours),
        # A's name with no secret, or a made-up one.
        (
            client.post(f"{API}/trials/{trial_id}/heartbeat", json=beat_as_a),
            403,
            "X-Runner-Secret: missing; send the secret POST /runners returned",
        ),
        (
            client.post(
                f"{API}/trials/{trial_id}/complete",
                json=forged,
                headers={"X-Runner-Secret": "guessed"},
            ),
            403,
            f"X-Runner-Secret: not the secret of runner {a}",
        ),
        (
            client.delete(f"{API}/runners/{a}"),
            403,
            "X-Runner-Secret: missing; send the secret POST /runners returned",
        ),
    ]
    for response, status, detail in tries:
        assert (response.status_code, response.json()) == (status, {"detail": detail})
    # A's lease is intact: its heartbeat and its honest report are taken.
    assert heartbeat(client, held, a).status_code == 200
    done = complete(client, held, a)
    assert (done.status_code, done.json()) == (200, {"verdict": "clean"})
    trial = client.get(f"{API}/trials/{trial_id}").json()
    assert (trial["status"], trial["runner_id"], trial["attempt"], trial["verdict"]) == (
        "done",
        a,
        1,
        "clean",
    )
    with Session(get_engine(settings_url(client))) as session:
        rss = session.exec(select(MemorySample.rss).where(MemorySample.trial_id == trial_id)).all()
    assert len(rss) == 121 and max(rss) < 510 * MIB  # A's samples, none of B's forgery
    assert lease(client, a) is not None  # A was not deleted: it leases the next trial


def test_the_secret_is_stored_hashed(client: TestClient) -> None:
    response = client.post(f"{API}/runners", json={"name": "x"})
    answer = response.json()
    secret = answer["runner_secret"]
    assert len(secret) >= 40
    with get_engine(settings_url(client)).connect() as conn:
        stored = conn.execute(
            text("SELECT secret_hash FROM runner WHERE id = :id"), {"id": answer["runner_id"]}
        ).scalar_one()
    assert stored == runner_routes.secret_hash(secret) and secret not in stored


# ------------------------------------------------------------------ idempotent submit


def test_a_repeated_idempotency_key_returns_the_first_job(
    client: TestClient, fixture_index: str
) -> None:
    key = {"Idempotency-Key": "ci-run-4711"}
    first = client.post(f"{API}/jobs", json=body(fixture_index), headers=key)
    assert first.status_code == 201, first.text
    again = client.post(f"{API}/jobs", json=body(fixture_index), headers=key)
    assert (again.status_code, again.json()) == (200, first.json())
    other = client.post(f"{API}/jobs", json=body(fixture_index), headers={"Idempotency-Key": "x"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    bad = client.post(f"{API}/jobs", json=body(fixture_index), headers={"Idempotency-Key": "a b"})
    assert (bad.status_code, bad.json()) == (
        422,
        {"detail": "Idempotency-Key: must be 1 to 200 printable ASCII characters without spaces"},
    )
    assert client.get(f"{API}/jobs").json()["total"] == 2


def test_idempotency_keys_belong_to_their_token(
    make_client: Callable[..., Any], fixture_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BISECT_API_TOKENS", "alice:tok-alice,bob:tok-bob")
    with make_client(allowed_indexes=["127.0.0.1"]) as client:
        ids = []
        for token in ("tok-alice", "tok-bob", "tok-alice"):
            headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "same"}
            response = client.post(f"{API}/jobs", json=body(fixture_index), headers=headers)
            assert response.status_code in (200, 201), response.text
            ids.append((response.status_code, response.json()["id"]))
    assert [code for code, _ in ids] == [201, 201, 200]
    assert ids[0][1] == ids[2][1] != ids[1][1]
    with Session(get_engine(settings_url(client))) as session:
        owners = session.exec(select(Job.owner).order_by(Job.id)).all()  # type: ignore[arg-type]
    assert owners == ["alice", "bob"]


# ------------------------------------------------------------------------- samples


def test_samples_are_paged_and_downsampled(client: TestClient, fixture_index: str) -> None:
    runner = register(client, "solo")
    submit(client, fixture_index)
    held = lease(client, runner)
    assert held is not None
    assert complete(client, held, runner).status_code == 200
    path = f"{API}/trials/{held['trial']['trial_id']}/samples"
    sent = report(held, runner)["samples"]

    def get(**params: Any) -> Any:
        return client.get(path, params=params)

    whole = get().json()
    assert (whole["total"], whole["offset"], whole["limit"], whole["max_points"]) == (
        121,
        0,
        20000,
        None,
    )
    assert [(s["t"], s["rss"]) for s in whole["samples"]] == [(s["t"], s["rss"]) for s in sent]
    page = get(offset=100, limit=50).json()
    assert [s["t"] for s in page["samples"]] == [i * 0.5 for i in range(100, 121)]
    assert page["total"] == 121
    small = get(max_points=20).json()
    kept = [s["t"] for s in small["samples"]]
    assert 4 <= len(kept) <= 20 and small["max_points"] == 20
    assert kept[0] == 0.0 and kept[-1] == 60.0 and kept == sorted(kept)
    assert min(s["rss"] for s in small["samples"]) == min(s["rss"] for s in sent)
    assert max(s["rss"] for s in small["samples"]) == max(s["rss"] for s in sent)
    for params, detail in [
        ({"limit": 0}, "limit: Input should be greater than or equal to 1"),
        ({"limit": 20001}, "limit: Input should be less than or equal to 20000"),
        ({"offset": -1}, "offset: Input should be greater than or equal to 0"),
        ({"max_points": 3}, "max_points: Input should be greater than or equal to 4"),
    ]:
        response = get(**params)
        assert (response.status_code, response.json()) == (422, {"detail": detail})


# ------------------------------------------------------------ classify outside the lock


def lock_is_free(url: str, trial_id: int) -> bool:
    """Could another writer take the trial (Postgres: its row; SQLite: the write lock) now?"""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:  # "database is locked"
            return False
        finally:
            conn.close()
    with get_engine(url).connect() as conn:
        try:
            conn.execute(
                text("SELECT id FROM trial WHERE id = :id FOR UPDATE NOWAIT"), {"id": trial_id}
            )
            return True
        except Exception:  # noqa: BLE001 - psycopg's LockNotAvailable
            return False
        finally:
            conn.rollback()


def test_reports_are_classified_with_no_lock_held(
    client: TestClient, fixture_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = settings_url(client)
    seen: list[tuple[int, bool]] = []
    judge = runner_routes.judge

    def watched(job: Job, report_: Any) -> Any:
        seen.append((report_.trial_id, lock_is_free(url, report_.trial_id)))
        return judge(job, report_)

    monkeypatch.setattr(runner_routes, "judge", watched)
    runner = register(client, "solo")
    submit(client, fixture_index, range="1.0.0..1.0.9")
    verdicts = []
    for _ in range(2):  # the good bound (clean), then the bad bound (leak)
        held = lease(client, runner)
        assert held is not None
        verdicts.append(complete(client, held, runner).json()["verdict"])
    assert verdicts == ["clean", "leak"]
    assert [free for _, free in seen] == [True, True]
    # And the probe can see a held lock: inside lock_for_report it reports busy.
    held = lease(client, runner)
    assert held is not None
    spec = held["trial"]
    with Session(get_engine(url)) as session:
        from service import queue

        queue.lock_for_report(session, spec["trial_id"], runner, spec["attempt"])
        assert lock_is_free(url, spec["trial_id"]) is False
        session.rollback()


def test_the_reaper_leaves_a_trial_whose_report_is_being_judged(
    make_client: Callable[..., Any], fixture_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judging runs outside the lock, so the lease is held meanwhile: a reaper that runs
    while the report is classified, a whole lease later and more, takes nothing."""
    from datetime import timedelta

    from service import queue
    from service.models import utcnow

    reaped: list[list[int]] = []
    judge = runner_routes.judge

    def slow(job: Job, report_: Any) -> Any:
        with Session(get_engine(url)) as session:
            later = utcnow() + timedelta(seconds=60)  # twice the lease has passed
            reaped.append([t.id for t in queue.reap(session, now=later)])  # type: ignore[misc]
        return judge(job, report_)

    monkeypatch.setattr(runner_routes, "judge", slow)
    with make_client(lease_s=30) as client:
        url = settings_url(client)
        runner = register(client, "slow-judge")
        submit(client, fixture_index)
        held = lease(client, runner)
        assert held is not None
        done = complete(client, held, runner)
        assert (done.status_code, done.json()) == (200, {"verdict": "clean"})
    assert reaped == [[]]


def test_hostile_headers_are_4xx(client: TestClient, fixture_index: str) -> None:
    runner = register(client, "r")
    cases = [
        (
            client.post(
                f"{API}/runners/{runner}/lease",
                params={"wait": 0},
                json={},
                headers={"X-Runner-Secret": "x" * 201},
            ),
            422,
            "X-Runner-Secret: String should have at most 200 characters",
        ),
        (
            client.post(
                f"{API}/jobs", json=body(fixture_index), headers={"Idempotency-Key": "k" * 201}
            ),
            422,
            "Idempotency-Key: must be 1 to 200 printable ASCII characters without spaces",
        ),
        (
            client.post(
                f"{API}/jobs",
                json=body(fixture_index),
                headers={"Idempotency-Key": "caf\u00e9".encode()},  # type: ignore[dict-item]
            ),
            422,
            "Idempotency-Key: must be 1 to 200 printable ASCII characters without spaces",
        ),
        (
            client.post(f"{API}/jobs", json=body(fixture_index), headers={"Idempotency-Key": ""}),
            422,
            "Idempotency-Key: must be 1 to 200 printable ASCII characters without spaces",
        ),
    ]
    for response, status, detail in cases:
        assert (response.status_code, response.json()) == (status, {"detail": detail})
    assert client.get(f"{API}/jobs").json()["total"] == 0
