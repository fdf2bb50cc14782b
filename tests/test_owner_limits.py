"""Limits per owner and per job (issue 26, row 8): each answered with its status and one
line naming the limit and its setting, on SQLite and on Postgres.

- active jobs per owner: the 21st queued or running job of one token is 429 (Retry-After),
  another token's is not, and a finished job frees its place;
- queued trials per owner: no new job while the owner has BISECT_MAX_QUEUED_TRIALS waiting;
- candidates per job: a range of 1000 releases is 413 at submission, no job written;
- option bounds: 20 repeats, 50 max runs, a 7-day timeout are 422, and --help shows them;
- a trial budget per job: a job that needs more trials stops as an error with its line;
- slow clients (`serve`): a head or a body that trickles is cut off at its deadline.
"""

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlmodel import Session, col, func, select
from typer.testing import CliRunner

from engine.verdicts import Verdict
from service.actions import advance_job
from service.app import create_app
from service.cli import app as cli_app
from service.cli.serve import _Api, bind
from service.db import get_engine, upgrade
from service.example.index import serve_index
from service.models import Candidate, Job, JobStatus, Trial, TrialKind, TrialStatus
from service.scheduler import advance
from service.settings import Settings

API = "/api/v1"
ALICE, BOB = "alice-secret-token", "bob-secret-token"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'limits.db'}"
    url = request.getfixturevalue("pg_url")
    upgrade(url)
    with get_engine(url).begin() as conn:  # one database per module: every test starts empty
        conn.execute(
            text("TRUNCATE memory_sample, trial, candidate, job, runner RESTART IDENTITY CASCADE")
        )
    return url


@pytest.fixture
def make_client(
    db_url: str, tmp_path: Path, uv_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))

    @contextmanager
    def make(**overrides: Any) -> Iterator[TestClient]:
        settings = Settings(
            database_url=db_url,
            data_dir=tmp_path / "data",
            cache_dir=tmp_path / "cache",
            reap_interval_s=0,
            trusted_hosts=["testserver"],
            allowed_indexes=["127.0.0.1"],  # the loopback fixture index
            api_tokens=f"alice:{ALICE},bob:{BOB}",  # type: ignore[arg-type]
            **overrides,
        )
        with TestClient(create_app(settings)) as client:
            yield client

    return make


def body(index: str, **overrides: Any) -> dict[str, Any]:
    return {
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "script": "pass",
        "index_url": index,
        **overrides,
    }


def post(client: TestClient, token: str, payload: dict[str, Any]) -> Any:
    return client.post(f"{API}/jobs", json=payload, headers=bearer(token))


def jobs_in(client: TestClient) -> int:
    settings: Settings = client.app.state.settings  # type: ignore[attr-defined]
    with Session(get_engine(settings.effective_database_url)) as session:
        return session.exec(select(func.count()).select_from(Job)).one()


# ------------------------------------------------------------------ per owner


def test_the_21st_active_job_of_an_owner_is_429(
    make_client: Callable[..., Any], fixture_index: str
) -> None:
    with make_client() as client:
        ids = []
        for _ in range(20):
            response = post(client, ALICE, body(fixture_index))
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
        refused = post(client, ALICE, body(fixture_index))
        assert refused.status_code == 429
        assert refused.json() == {
            "detail": "too many active jobs: alice has 20 queued or running "
            "(BISECT_MAX_ACTIVE_JOBS=20)"
        }
        assert refused.headers["Retry-After"] == "30"
        assert jobs_in(client) == 20
        # Per owner: bob is not held back by alice's jobs.
        assert post(client, BOB, body(fixture_index)).status_code == 201
        # A finished job frees its place.
        headers = {**bearer(ALICE), "Content-Type": "application/json"}
        cancel = client.post(f"{API}/jobs/{ids[0]}/cancel", headers=headers)
        assert cancel.status_code == 200, cancel.text
        assert post(client, ALICE, body(fixture_index)).status_code == 201


def test_no_new_job_while_an_owner_has_too_many_queued_trials(
    make_client: Callable[..., Any], fixture_index: str
) -> None:
    with make_client(max_queued_trials=2) as client:
        # Each new job queues its resolve trial, which waits for a runner (none here).
        for _ in range(2):
            assert post(client, ALICE, body(fixture_index)).status_code == 201
        refused = post(client, ALICE, body(fixture_index))
        assert refused.status_code == 429
        assert refused.json() == {
            "detail": "too many queued trials: alice has 2 waiting for a runner "
            "(BISECT_MAX_QUEUED_TRIALS=2)"
        }
        assert refused.headers["Retry-After"] == "30"
        assert post(client, BOB, body(fixture_index)).status_code == 201


# -------------------------------------------------------------------- per job


@pytest.fixture(scope="module")
def thousand_releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An index listing 1000 releases of leakyfixture (empty files: listing reads names)."""
    wheels = tmp_path_factory.mktemp("thousand")
    for i in range(1000):
        (wheels / f"leakyfixture-1.0.{i}-py3-none-any.whl").write_bytes(b"")
    with serve_index(wheels) as url:
        yield url


def test_a_range_of_1000_releases_is_refused_at_submission(
    make_client: Callable[..., Any], thousand_releases: str
) -> None:
    with make_client() as client:
        response = post(client, ALICE, body(thousand_releases, range="1.0.0..1.0.999"))
        assert response.status_code == 413
        assert response.json() == {
            "detail": "range: 1000 releases from 1.0.0 to 1.0.999; a job may test at most "
            "500 (BISECT_MAX_CANDIDATES=500): narrow the range"
        }
        assert "Retry-After" not in response.headers  # asked again as it is, it fails again
        assert jobs_in(client) == 0
        within = post(client, ALICE, body(thousand_releases, range="1.0.0..1.0.499"))
        assert within.status_code == 201, within.text


def test_the_reviews_costly_options_are_refused(
    make_client: Callable[..., Any], fixture_index: str
) -> None:
    costly = {"repeats": 20, "max_runs": 50, "timeout_s": 7 * 24 * 3600}
    with make_client() as client:
        response = post(client, ALICE, body(fixture_index, **costly))
        assert response.status_code == 422
        assert response.json() == {
            "detail": "max_runs: Input should be less than or equal to 20; "
            "timeout_s: Input should be less than or equal to 86400"
        }
        assert jobs_in(client) == 0


def test_help_shows_the_option_bounds() -> None:
    result = CliRunner().invoke(cli_app, ["submit", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for flag, bound in (("--repeats", "1<=x<=20"), ("--max-runs", "1<=x<=20")):
        assert any(flag in line and bound in line for line in lines), flag
    assert any("--timeout" in line and "x<=86400" in line for line in lines)


# ------------------------------------------------------------- trial budget

VERSIONS = [f"1.0.{i}" for i in range(10)]
BUDGET_LINE = (
    "stopped: the job reached its budget of 5 trials without converging "
    "(BISECT_MAX_TRIALS_PER_JOB=5)"
)


@pytest.fixture
def session(db_url: str) -> Iterator[Session]:
    upgrade(db_url)
    with Session(get_engine(db_url)) as session:
        yield session


def seed(session: Session, **fields: Any) -> Job:
    """A job over VERSIONS with its pins held already (no resolve trial), as the scheduler
    tests seed one."""
    job = Job(
        package="leakyfixture",
        good=VERSIONS[0],
        bad=VERSIONS[-1],
        script="pass",
        script_sha256="abc",
        constraints=["leakyfixture==1.0.0"],
        reuse_verdicts=False,
        **fields,
    )
    session.add(job)
    session.flush()
    for position, version in enumerate(VERSIONS):
        session.add(Candidate(job_id=job.id, position=position, version=version))
    session.commit()
    session.refresh(job)
    return job


def run_to_end(session: Session, job: Job, step: Callable[[], object], verdict: Verdict) -> None:
    """Finish every queued trial with `verdict` (a repro that never decides) and step the
    job, until it ends or nothing is queued."""
    step()
    for _ in range(200):
        query = select(Trial).where(
            Trial.job_id == job.id,
            Trial.status == TrialStatus.QUEUED,
            Trial.kind != TrialKind.COMMITS,
        )
        queued = list(session.exec(query))
        if not queued or JobStatus(job.status).finished:
            return
        for trial in queued:
            trial.status = TrialStatus.DONE
            trial.verdict = verdict
            trial.analysis = {"growth_mib": 0.5}
            session.add(trial)
        session.commit()
        step()


def trials_by_status(session: Session, job: Job) -> dict[str, int]:
    query = select(Trial.status, func.count()).where(Trial.job_id == job.id)
    return dict(session.exec(query.group_by(col(Trial.status))).all())  # type: ignore[arg-type]


def test_a_job_that_needs_more_than_its_budget_stops_with_its_line(session: Session) -> None:
    # Inconclusive runs, up to 20 per candidate: the search cannot converge in 5 trials.
    job = seed(session, max_runs=20)
    settings = Settings(max_trials_per_job=5)
    run_to_end(session, job, lambda: advance_job(session, job, settings), Verdict.INCONCLUSIVE)
    session.refresh(job)
    assert job.status == JobStatus.ERROR
    assert job.message == BUDGET_LINE
    assert job.result is not None and job.result.message == BUDGET_LINE
    assert job.finished_at is not None
    counts = trials_by_status(session, job)
    # Run up to the budget; the step that needed more was cancelled with the job.
    assert 0 < counts[TrialStatus.DONE] <= 5
    assert counts[TrialStatus.DONE] + counts[TrialStatus.CANCELLED] > 5
    assert TrialStatus.QUEUED not in counts
    # Ended: a later step changes nothing.
    advance_job(session, job, settings)
    assert trials_by_status(session, job) == counts


def test_a_job_within_its_budget_runs_as_before(session: Session) -> None:
    job = seed(session)
    settings = Settings(max_trials_per_job=5)
    run_to_end(session, job, lambda: advance_job(session, job, settings), Verdict.CLEAN)
    session.refresh(job)
    # All clean: the bounds check fails after its two bounds, not at the budget.
    assert job.status == JobStatus.BOUNDS_FAILED, job.message
    # Without a budget (`bisect-cli run`) the same never-deciding job runs on past 5.
    local = seed(session, max_runs=20)
    run_to_end(session, local, lambda: advance(session, local, 1), Verdict.INCONCLUSIVE)
    assert sum(trials_by_status(session, local).values()) > 5


# ---------------------------------------------------------------- slow clients


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, _Api]]:
    """`serve`'s API (its uvicorn config) on loopback, with short read deadlines."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'serve.db'}",
        data_dir=tmp_path / "data",
        cache_dir=tmp_path / "cache",
        reap_interval_s=0,
        header_timeout_s=0.5,
        body_timeout_s=0.5,
    )
    sock = bind("127.0.0.1", 0)
    api = _Api(settings, sock, 1)
    assert api.start(threading.Event())
    try:
        yield sock.getsockname()[1], api
    finally:
        api.stop()


def wait_closed(conn: socket.socket, sends: list[bytes], gap: float) -> None:
    """Send `sends` `gap` s apart (while the server lets us), then read until it closes."""
    try:
        for data in sends:
            conn.sendall(data)
            time.sleep(gap)
        while conn.recv(4096):
            pass  # a response (or part of one) before the close
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed by the server: what is waited for


def closed_after(port: int, *sends: bytes) -> float:
    """Seconds until the server closes a connection that sends `sends` 0.2 s apart (a
    connection still open after 5 s fails the test: socket timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        start = time.monotonic()
        wait_closed(conn, list(sends), 0.2)
        return time.monotonic() - start


def test_serve_cuts_off_a_head_or_body_that_trickles(served: tuple[int, _Api]) -> None:
    port, api = served
    assert api.server is not None
    assert api.server.config.timeout_keep_alive == Settings().keep_alive_s
    assert api.server.config.limit_concurrency == Settings().max_connections
    # Nothing at all, then a head a byte at a time past its deadline: cut off near 0.5 s,
    # not renewed by the bytes.
    assert closed_after(port) < 2
    head = b"GET /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    assert closed_after(port, *[head[i : i + 1] for i in range(12)]) < 3
    # A body that stops halfway.
    post_head = b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
    post_head += b"application/json\r\nContent-Length: 100\r\n\r\n{"
    assert closed_after(port, post_head) < 2
    # A prompt request is answered, and a kept-alive connection's next head has a deadline.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(head + b"\r\n")
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        wait_closed(conn, [bytes([b]) for b in b"GET /api/v1/jobs HTTP/1.1\r\n"], 0.1)
        assert time.monotonic() - start < 3
