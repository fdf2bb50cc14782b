"""Lease rules of service.queue, on SQLite and on Postgres."""

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from service import queue
from service.db import make_engine, upgrade
from service.models import Candidate, Job, JobStatus, Runner, Trial, TrialStatus
from service.queue import StaleLease

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CPU = Runner(id="r-1", name="cpu-1")
CPU2 = Runner(id="r-2", name="cpu-2")
GPU = Runner(id="g-1", name="gpu-1", gpu_count=1)


@pytest.fixture(scope="module")
def pg_migrated(pg_url: str) -> str:
    upgrade(pg_url)
    return pg_url


def empty_pg(url: str) -> str:
    """One database per module (pg_url): start every test with empty tables."""
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE trial, candidate, job, runner RESTART IDENTITY CASCADE"))
    engine.dispose()
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return empty_pg(request.getfixturevalue("pg_migrated"))
    sqlite_url = f"sqlite:///{tmp_path / 'queue.db'}"
    upgrade(sqlite_url)
    return sqlite_url


@pytest.fixture
def engine(url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine):  # type: ignore[no-untyped-def]
    with Session(engine) as session:
        yield session


def seed(session: Session, trials: int = 3, **job_fields: object) -> list[int]:
    """A job with one candidate per trial, each with one queued trial; returns trial ids."""
    job = Job(package="pkg", good="1.0", bad="2.0", script="pass", script_sha256="0", **job_fields)
    session.add(job)
    session.flush()
    ids = []
    for position in range(trials):
        candidate = Candidate(job_id=job.id, position=position, version=f"1.{position}")
        session.add(candidate)
        session.flush()
        trial = Trial(job_id=job.id, candidate_id=candidate.id, number=position + 1)
        session.add(trial)
        session.flush()
        ids.append(trial.id)
    session.commit()
    return ids


def test_claim_oldest_first_and_sets_the_lease(session: Session) -> None:
    ids = seed(session)
    trial = queue.claim(session, CPU, lease_s=30, now=T0)
    assert trial is not None
    assert (trial.id, trial.status, trial.runner_id, trial.attempt) == (ids[0], "leased", "r-1", 1)
    assert trial.started_at == T0
    assert trial.lease_expires_at == T0 + timedelta(seconds=30)
    assert queue.claim(session, CPU2, lease_s=30, now=T0).id == ids[1]  # type: ignore[union-attr]
    assert queue.queue_depth(session) == 1


def test_no_work(session: Session) -> None:
    assert queue.claim(session, CPU, lease_s=30) is None
    seed(session, 1)
    assert queue.claim(session, CPU, lease_s=30) is not None
    assert queue.claim(session, CPU, lease_s=30) is None


@pytest.mark.parametrize("status", [JobStatus.FOUND, JobStatus.CANCELLED])
def test_finished_jobs_are_not_claimed(session: Session, status: JobStatus) -> None:
    seed(session, 2, status=status)
    assert queue.claim(session, CPU, lease_s=30) is None
    assert queue.queue_depth(session) == 0


def test_gpu_trials_only_for_gpu_runners(session: Session) -> None:
    [gpu_trial] = seed(session, 1, requires_gpu=True)
    [cpu_trial] = seed(session, 1)
    assert queue.claim(session, CPU, lease_s=30).id == cpu_trial  # type: ignore[union-attr]
    assert queue.claim(session, CPU2, lease_s=30) is None
    assert queue.claim(session, GPU, lease_s=30).id == gpu_trial  # type: ignore[union-attr]


def test_local_jobs_belong_to_their_own_process(session: Session) -> None:
    """`bisect-cli run` and `serve` may share a database: no runner takes a local job's
    trials, the reaper never takes them over, and the local process leases them itself."""
    ids = seed(session, 2, local=True, status=JobStatus.RUNNING)
    assert queue.claim(session, CPU, lease_s=30, now=T0) is None
    assert queue.queue_depth(session) == 0
    job = session.exec(select(Job)).one()
    first = queue.claim_local(session, job, now=T0)
    assert first is not None
    assert (first.id, first.status, first.runner_id) == (ids[0], "leased", "local")
    assert first.attempt == 1
    assert (first.started_at, first.lease_expires_at) == (T0, None)
    assert queue.reap(session, now=T0 + timedelta(days=1)) == []
    assert queue.claim_local(session, job, now=T0).id == ids[1]  # type: ignore[union-attr]
    assert queue.claim_local(session, job, now=T0) is None


def test_heartbeat_extends_and_checks_the_lease(session: Session) -> None:
    [tid] = seed(session, 1)
    queue.claim(session, CPU, lease_s=30, now=T0)
    later = T0 + timedelta(seconds=20)
    trial = queue.heartbeat(session, tid, "r-1", 1, lease_s=30, now=later)
    assert trial.lease_expires_at == later + timedelta(seconds=30)

    # The message names the caller's lease, never the holder's (r-1 attempt 1).
    leased = f"trial {tid} is held by another lease"
    with pytest.raises(StaleLease) as wrong_runner:
        queue.heartbeat(session, tid, "r-2", 1, lease_s=30)
    assert str(wrong_runner.value) == f"{leased}, not runner r-2 attempt 1"
    with pytest.raises(StaleLease) as old_attempt:
        queue.heartbeat(session, tid, "r-1", 0, lease_s=30)
    assert str(old_attempt.value) == f"{leased}, not runner r-1 attempt 0"
    with pytest.raises(LookupError, match="trial 999 not found"):
        queue.heartbeat(session, 999, "r-1", 1, lease_s=30)

    session.get(Trial, tid).status = TrialStatus.CANCELLED  # type: ignore[union-attr]
    session.commit()
    with pytest.raises(StaleLease, match=f"^trial {tid} was cancelled$"):
        queue.heartbeat(session, tid, "r-1", 1, lease_s=30)


def test_expired_lease_is_reaped_and_reclaimed(session: Session) -> None:
    [tid] = seed(session, 1)
    queue.claim(session, CPU, lease_s=30, now=T0)
    assert queue.reap(session, now=T0 + timedelta(seconds=29)) == []  # not yet

    [reaped] = queue.reap(session, now=T0 + timedelta(seconds=31))
    assert (reaped.status, reaped.runner_id, reaped.lease_expires_at) == ("queued", None, None)
    assert (reaped.id, reaped.attempt) == (tid, 1)
    requeued = f"trial {tid} is queued, not leased to runner r-1 attempt 1"
    with pytest.raises(StaleLease, match=f"^{requeued}$"):
        queue.heartbeat(session, tid, "r-1", 1, lease_s=30)

    trial = queue.claim(session, CPU2, lease_s=30, now=T0 + timedelta(seconds=40))
    assert (trial.id, trial.runner_id, trial.attempt) == (tid, "r-2", 2)  # type: ignore[union-attr]
    stale = f"trial {tid} is held by another lease, not runner r-1 attempt 1"
    with pytest.raises(StaleLease, match=f"^{stale}$"):
        queue.heartbeat(session, tid, "r-1", 1, lease_s=30)
    with pytest.raises(StaleLease, match=f"^{stale}$"):
        queue.lock_for_report(session, tid, "r-1", 1)

    trial = queue.lock_for_report(session, tid, "r-2", 2)  # the current lease may report
    trial.status, trial.verdict = TrialStatus.DONE, "clean"
    session.commit()
    done = f"trial {tid} is done, not leased to runner r-2 attempt 2"
    with pytest.raises(StaleLease, match=f"^{done}$"):
        queue.lock_for_report(session, tid, "r-2", 2)


def test_max_attempts_exhausted_finishes_with_error(session: Session) -> None:
    [tid] = seed(session, 1)
    now = T0
    for n, runner in enumerate([CPU, CPU2, GPU], start=1):
        trial = queue.claim(session, runner, lease_s=10, now=now)
        assert trial.attempt == n  # type: ignore[union-attr]
        now += timedelta(seconds=11)
        [trial] = queue.reap(session, max_attempts=3, now=now)
    reason = "lease expired 3 times (last runner g-1)"
    assert (trial.status, trial.verdict, trial.error) == ("done", "error", reason)
    assert trial.analysis == {"reason": reason}
    assert trial.finished_at == now
    assert queue.claim(session, CPU, lease_s=10, now=now) is None


def test_give_back_does_not_use_up_an_attempt(session: Session) -> None:
    [tid] = seed(session, 1)
    queue.claim(session, CPU, lease_s=30)
    trial = queue.give_back(session, tid, "r-1", 1)
    assert (trial.status, trial.runner_id, trial.attempt) == ("queued", None, 0)
    with pytest.raises(StaleLease):
        queue.give_back(session, tid, "r-1", 1)
    assert queue.claim(session, CPU2, lease_s=30).attempt == 1  # type: ignore[union-attr]


REFUSED = {
    "cause": "refused",
    "host": "127.0.0.1:9",
    "rule": "host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES",
    "message": "the job's outbound rule refused 127.0.0.1:9: host 127.0.0.1 is not in "
    "BISECT_ALLOWED_INDEXES",
}


def live(session: Session, *runners: Runner, seen: datetime = T0) -> None:
    """Store `runners` as registered and seen at `seen` (copies: the constants stay clean)."""
    for runner in runners:
        session.add(Runner(id=runner.id, name=runner.name, gpu_count=runner.gpu_count,
                           last_seen=seen))  # fmt: skip
    session.commit()


def test_infrastructure_failures_retry_on_another_runner_without_an_attempt(
    session: Session,
) -> None:
    """Each failure goes back to the queue (attempt not spent), passed over by the runner
    that failed it while the other is live; the third finishes the trial, no verdict."""
    [tid] = seed(session, 1)
    live(session, CPU, CPU2)
    runners = []
    for n, runner in enumerate([CPU, CPU2, CPU], start=1):
        trial = queue.claim(session, runner, lease_s=30, now=T0)
        assert (trial.id, trial.attempt) == (tid, 1)  # type: ignore[union-attr]
        runners.append(runner.id)
        trial = queue.infrastructure_failed(session, trial, REFUSED, now=T0)  # type: ignore[arg-type]
        assert trial.infra_runner == runner.id
        assert [f["runner"] for f in trial.infra_failures] == runners
        if n < queue.INFRA_TRIES:
            assert (trial.status, trial.attempt, trial.runner_id) == ("queued", 0, None)
            assert trial.lease_expires_at is None
            assert queue.claim(session, runner, lease_s=30, now=T0) is None  # the other first
            assert not queue.infrastructure_spent(trial)
    assert n == queue.INFRA_TRIES == 3
    assert (trial.status, trial.verdict, trial.attempt) == ("done", None, 1)
    assert (trial.error, trial.finished_at) == (REFUSED["message"], T0)
    assert trial.infra_failures == [{**REFUSED, "runner": r, "attempt": 1} for r in runners]
    assert queue.infrastructure_spent(trial)
    assert queue.claim(session, CPU2, lease_s=30, now=T0) is None


def test_the_runner_that_failed_takes_it_again_when_no_other_could(session: Session) -> None:
    """Another runner first only while one is live and able: one seen too long ago, one
    that left, or one without the GPU a job needs does not hold the trial back."""
    [gpu_trial] = seed(session, 1, requires_gpu=True)  # the oldest: the GPU runner's first
    [cpu_trial] = seed(session, 1)
    live(session, CPU, GPU)
    live(session, CPU2, seen=T0 - timedelta(seconds=queue.LIVE_S + 1))
    gone = Runner(id="r-3", name="gone")
    live(session, gone)
    queue.release_runner(session, "r-3")
    trial = queue.claim(session, GPU, lease_s=30, now=T0)
    assert trial is not None and trial.id == gpu_trial
    queue.infrastructure_failed(session, trial, REFUSED, now=T0)
    # The CPU runners cannot take a GPU trial: the GPU runner takes it again at once.
    assert queue.claim(session, GPU, lease_s=30, now=T0).id == gpu_trial  # type: ignore[union-attr]
    trial = queue.claim(session, CPU, lease_s=30, now=T0)
    assert trial is not None and trial.id == cpu_trial
    queue.infrastructure_failed(session, trial, REFUSED, now=T0)
    # GPU is live and can take a CPU trial: CPU passes it over, until GPU goes quiet.
    assert queue.claim(session, CPU, lease_s=30, now=T0) is None
    later = T0 + timedelta(seconds=queue.LIVE_S + 1)
    queue.touch_runner(session, "r-1", now=later)
    again = queue.claim(session, CPU, lease_s=30, now=later)
    assert again is not None and (again.id, again.attempt) == (cpu_trial, 1)


def test_an_infrastructure_failure_needs_the_current_lease(session: Session) -> None:
    [tid] = seed(session, 1)
    trial = queue.claim(session, CPU, lease_s=30, now=T0)
    assert trial is not None
    queue.give_back(session, tid, "r-1", 1)
    stale = Trial(id=tid, job_id=trial.job_id, candidate_id=trial.candidate_id, runner_id="r-1",
                  attempt=1)  # fmt: skip
    with pytest.raises(StaleLease):
        queue.infrastructure_failed(session, stale, REFUSED, now=T0)
    stored = session.get(Trial, tid, populate_existing=True)
    assert (stored.status, stored.infra_failures, stored.infra_runner) == ("queued", [], None)  # type: ignore[union-attr]


def test_release_runner(session: Session) -> None:
    session.add(Runner(id="r-1", name="cpu-1", last_seen=T0))
    session.commit()
    a, b, c = seed(session, 3)
    queue.claim(session, CPU, lease_s=30)
    queue.claim(session, CPU2, lease_s=30)
    queue.claim(session, CPU, lease_s=30)
    assert queue.release_runner(session, "r-1") == 2
    trials = {t.id: t for t in session.exec(select(Trial))}
    assert [(trials[i].status, trials[i].attempt) for i in (a, b, c)] == [
        ("queued", 0),
        ("leased", 1),
        ("queued", 0),
    ]
    assert session.get(Runner, "r-1").active is False  # type: ignore[union-attr]


def test_runners_seen_recently(session: Session) -> None:
    session.add(Runner(id="r-1", name="a", last_seen=T0 - timedelta(minutes=5)))
    session.add(Runner(id="r-2", name="b", last_seen=T0 - timedelta(minutes=5)))
    session.add(Runner(id="r-3", name="c", last_seen=T0, active=False))
    session.commit()
    assert queue.touch_runner(session, "r-2", now=T0).last_seen == T0  # type: ignore[union-attr]
    assert queue.touch_runner(session, "nobody", now=T0) is None
    assert [r.id for r in queue.live_runners(session, within_s=60, now=T0)] == ["r-2"]


def test_concurrent_claims_never_double_claim(engine: Engine) -> None:
    with Session(engine) as session:
        ids = seed(session, 200)

    def drain(n: int) -> list[int]:
        runner = Runner(id=f"r-{n}", name=f"r-{n}")
        claimed = []
        with Session(engine) as session:
            while (trial := queue.claim(session, runner, lease_s=60)) is not None:
                claimed.append(trial.id)
        return claimed

    with ThreadPoolExecutor(12) as pool:
        claimed = [tid for batch in pool.map(drain, range(12)) for tid in batch]
    assert sorted(claimed) == ids
    assert not [tid for tid, n in Counter(claimed).items() if n > 1]
    with Session(engine) as session:
        attempts = session.exec(select(Trial.attempt).where(col(Trial.id).in_(ids))).all()
    assert set(attempts) == {1}


@contextmanager
def claim_held_open(engine: Engine, runner: Runner) -> Iterator[tuple[Future, threading.Event]]:
    """Run claim() on its own connection and stop it just before COMMIT until released."""
    updated, release = threading.Event(), threading.Event()
    holder = Session(engine)

    @event.listens_for(holder, "before_commit")
    def _hold(_session: Session) -> None:  # the UPDATE has run; its transaction is open
        updated.set()
        assert release.wait(10)

    with ThreadPoolExecutor(1) as pool:
        claimed = pool.submit(queue.claim, holder, runner, lease_s=30)
        assert updated.wait(10)
        try:
            yield claimed, release
        finally:
            release.set()
    holder.close()


def test_postgres_second_connection_skips_the_locked_trial(pg_migrated: str) -> None:
    url = empty_pg(pg_migrated)
    first_engine = make_engine(url)
    # Were connection 2 to wait on connection 1's row lock, it would fail here, not hang.
    second_engine = create_engine(url, connect_args={"options": "-c lock_timeout=2s"})
    with Session(first_engine) as session:
        first_id, second_id, third_id = seed(session, 3)

    with claim_held_open(first_engine, CPU) as (first, release):
        with Session(second_engine) as session:
            second = queue.claim(session, CPU2, lease_s=30)
            assert second is not None and second.id == second_id
            # Connection 1 has not committed: to everyone else its trial still looks queued.
            assert session.get(Trial, first_id).status == "queued"  # type: ignore[union-attr]
        release.set()
        assert first.result().id == first_id
    with Session(second_engine) as session:
        runners = dict(session.exec(select(Trial.id, Trial.runner_id)).all())
    assert runners == {first_id: "r-1", second_id: "r-2", third_id: None}
    first_engine.dispose()
    second_engine.dispose()


def test_sqlite_second_claim_waits_for_the_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        first_id, second_id = seed(session, 2)

    with (
        ThreadPoolExecutor(1) as pool,
        Session(engine) as session,
        claim_held_open(engine, CPU) as (first, release),
    ):
        second = pool.submit(queue.claim, session, CPU2, lease_s=30)
        time.sleep(0.3)
        assert not second.done()  # serialized behind the open write transaction
        release.set()
        assert first.result().id == first_id
        assert second.result(10).id == second_id  # not the same trial
    engine.dispose()
