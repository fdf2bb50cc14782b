"""The runner protocol against a runner that sends garbage (issue 26, row 6).

Every number a runner sends is finite and within 64 bits and its meaning, every text and
list has a cap (contract/wire.py): a report, heartbeat or registration that breaks one is
422 with one line naming the field, nothing of it is stored, and the job goes on (the
runner's honest report is taken, the next lease works). A row stored before these checks
(an Infinity duration in an existing database) can no longer make a lease fail.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from contract import wire
from service.db import get_engine
from service.models import Trial
from tests import test_api
from tests.test_api import API, as_runner, register, report, submit

make_client = test_api.make_client


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'bounds.db'}"


@pytest.fixture
def client(make_client: Any) -> Iterator[TestClient]:
    with make_client() as client:
        yield client


def post_raw(client: TestClient, path: str, text: str, runner: str) -> Any:
    """POST `text` as it is: httpx's json= refuses NaN and Infinity, a hostile runner
    does not (Python's json module writes them)."""
    headers = {**as_runner(runner), "Content-Type": "application/json"}
    return client.post(f"{API}{path}", content=text.encode(), headers=headers)


def lease(client: TestClient, runner: str) -> dict[str, Any] | None:
    """The runner's next lease (None: no work), sent as the runner sends it."""
    headers = {**as_runner(runner), "Content-Type": "application/json"}
    answer = client.post(f"{API}/runners/{runner}/lease", params={"wait": 0}, headers=headers)
    assert answer.status_code in (200, 204), answer.text
    return answer.json() if answer.status_code == 200 else None


def held_trial(client: TestClient, index: str) -> tuple[str, dict[str, Any]]:
    runner = register(client, "r")
    submit(client, index)
    held = lease(client, runner)
    assert held is not None and held["trial"]["kind"] == "run"
    return runner, held


def with_path(value: dict[str, Any], path: str, new: Any) -> dict[str, Any]:
    """`value` with the dotted `path` set to `new` (a copy)."""
    out = json.loads(json.dumps(value))
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = new
    return out


MB8 = "x" * (8 * 1000 * 1000)
DEEP: Any = {"tracer": "tracemalloc"}
for _ in range(200):
    DEEP = {"a": DEEP}

# (dotted field, value, the 422's line): each of these was stored or answered 500 before.
BAD_REPORTS: list[tuple[str, Any, str]] = [
    ("duration_s", float("inf"), "duration_s: Input should be a finite number"),
    ("duration_s", float("nan"), "duration_s: Input should be a finite number"),
    ("duration_s", -1.0, "duration_s: Input should be greater than or equal to 0"),
    ("env.seconds", float("-inf"), "env.seconds: Input should be a finite number"),
    ("exit_code", 10**30, "exit_code: Input should be less than or equal to 255"),
    ("exit_code", 2**63, "exit_code: Input should be less than or equal to 255"),
    ("exit_code", -256, "exit_code: Input should be greater than or equal to -255"),
    ("attempt", 2**63, f"attempt: Input should be less than or equal to {wire.MAX_ATTEMPT}"),
    ("attempt", -1, "attempt: Input should be greater than or equal to 0"),
    ("samples_taken", 2**64, f"samples_taken: Input should be less than or equal to {1 << 62}"),
    ("env.error", MB8, f"env.error: String should have at most {wire.MAX_ERROR} characters"),
    ("error", MB8, f"error: String should have at most {wire.MAX_ERROR} characters"),
    ("env.freeze", ["x==1"] * (wire.MAX_PINS + 1), "env.freeze: List should have at most"),
    ("env.freeze", ["x" * (wire.MAX_LINE + 1)], "env.freeze.0: String should have at most"),
    ("pins", ["x" * (wire.MAX_LINE + 1)], "pins.0: String should have at most"),
    ("env.python_executable", "p" * (wire.MAX_PATH + 1), "env.python_executable: String"),
    ("env.resolution_note", MB8, "env.resolution_note: String should have at most"),
    ("cap_method", "c" * 1000, "cap_method: String should have at most 40 characters"),
    ("runner_id", "r" * 1000, "runner_id: String should have at most 200 characters"),
    ("missing_protections", ["m" * 1000], "missing_protections.0: String should have at most"),
    ("steps", [[0.0, 2**64]], f"steps.0.1: Input should be less than or equal to {1 << 62}"),
    ("early_stop", {"looks": 1, "horizon_steps": 2**64}, "early_stop.horizon_steps: Input"),
    ("attribution", {"tracer": "x", "t": float("inf")}, "attribution: not a finite number"),
    ("attribution", {"s": MB8}, "attribution: larger than"),
    ("attribution", DEEP, f"attribution: nested deeper than {wire.MAX_JSON_DEPTH}"),
    ("attribution", {"n": 2**64}, "attribution: an integer outside 64 bits"),
]


@pytest.mark.parametrize(("field", "value", "detail"), BAD_REPORTS, ids=[b[0] for b in BAD_REPORTS])
def test_a_bad_report_is_422_and_the_job_goes_on(
    client: TestClient, fixture_index: str, field: str, value: Any, detail: str
) -> None:
    runner, held = held_trial(client, fixture_index)
    trial_id = held["trial"]["trial_id"]
    bad = with_path(report(held, runner), field, value)
    answer = post_raw(client, f"/trials/{trial_id}/complete", json.dumps(bad), runner)
    assert answer.status_code == 422, answer.text[:300]
    line = answer.json()["detail"]
    assert line.startswith(detail) and "\n" not in line and len(line) < 400, line
    # Nothing was stored: the trial is still this runner's, and its honest report is taken.
    assert client.get(f"{API}/trials/{trial_id}").json()["duration_s"] is None
    done = post_raw(
        client, f"/trials/{trial_id}/complete", json.dumps(report(held, runner)), runner
    )
    assert done.status_code == 200, done.text
    assert lease(client, runner) is not None  # the job goes on


BAD_BEATS: list[tuple[str, Any, str]] = [
    ("rss", -1, "rss: Input should be greater than or equal to 0"),
    ("rss", 2**63, f"rss: Input should be less than or equal to {wire.MAX_SAMPLE_BYTES}"),
    ("rss", float("inf"), "rss: Input should be a finite number"),
    ("attempt", 2**63, f"attempt: Input should be less than or equal to {wire.MAX_ATTEMPT}"),
    ("attempt", 1e30, "attempt: Unable to parse input string as an integer"),
]


@pytest.mark.parametrize(("field", "value", "detail"), BAD_BEATS, ids=[b[0] for b in BAD_BEATS])
def test_a_bad_heartbeat_or_return_is_422(
    client: TestClient, fixture_index: str, field: str, value: Any, detail: str
) -> None:
    runner, held = held_trial(client, fixture_index)
    spec = held["trial"]
    beat = {"runner_id": runner, "attempt": spec["attempt"], "rss": 1} | {field: value}
    for path in ("heartbeat", "return") if field != "rss" else ("heartbeat",):
        answer = post_raw(client, f"/trials/{spec['trial_id']}/{path}", json.dumps(beat), runner)
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["detail"].startswith(detail), (path, answer.json())
    ok = {"runner_id": runner, "attempt": spec["attempt"], "rss": 5}
    assert post_raw(
        client, f"/trials/{spec['trial_id']}/heartbeat", json.dumps(ok), runner
    ).is_success


BAD_REGISTRATIONS: list[tuple[dict[str, Any], str]] = [
    ({"capabilities": {"memory_bytes": 2**64}}, "capabilities.memory_bytes: Input should be"),
    ({"capabilities": {"cpus": -1}}, "capabilities.cpus: Input should be greater than or equal"),
    ({"capabilities": {"pythons": ["3"] * 1000}}, "capabilities.pythons: List should have at"),
    ({"capabilities": {"platform": "p" * 10_000}}, "capabilities.platform: String should have"),
    (
        {"capabilities": {"gpus": [{"memory_bytes": float("nan")}]}},
        "capabilities.gpus.0: not a finite number",
    ),
    ({"labels": {"k" * 1000: "v"}}, "labels: a key or value is longer than"),
    ({"labels": {str(i): "v" for i in range(1000)}}, "labels: Dictionary should have at most"),
]


@pytest.mark.parametrize(("extra", "detail"), BAD_REGISTRATIONS)
def test_a_bad_registration_is_422(client: TestClient, extra: dict[str, Any], detail: str) -> None:
    answer = client.post(
        f"{API}/runners",
        content=json.dumps({"name": "r"} | extra).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text[:300]
    assert answer.json()["detail"].startswith(detail), answer.json()


def test_an_infinite_duration_stored_before_cannot_fail_a_lease(
    client: TestClient, fixture_index: str
) -> None:
    """A database written before the checks: the first trial done with an Infinity (and
    one with NaN) duration. The next lease of the job works and reads them as unknown."""
    runner, held = held_trial(client, fixture_index)
    trial_id = held["trial"]["trial_id"]
    done = post_raw(
        client, f"/trials/{trial_id}/complete", json.dumps(report(held, runner)), runner
    )
    assert done.status_code == 200
    url = client.app.state.settings.effective_database_url  # type: ignore[attr-defined]
    with Session(get_engine(url)) as session:
        trial = session.exec(select(Trial).where(Trial.id == trial_id)).one()
        session.connection().exec_driver_sql(
            "UPDATE trial SET duration_s = ?, env_seconds = ? WHERE id = ?",
            (float("inf"), float("-inf"), trial.id),
        )
        session.commit()
    again = lease(client, runner)
    assert again is not None and again["trial"]["early_stop"]["horizon_s"] is None
    shown = client.get(f"{API}/trials/{trial_id}")
    assert shown.status_code == 200 and shown.json()["duration_s"] is None
    job_id = shown.json()["job_id"]
    assert client.get(f"{API}/jobs/{job_id}").status_code == 200
    assert client.get(f"/jobs/{job_id}").status_code == 200
