"""The trial queue: every SQL statement that touches a lease lives here.

Lease rules
-----------
- A trial is `queued`, `leased`, `done` or `cancelled`. Only `queued` trials of an open job
  (status `queued` or `running`) are claimable; a job with `requires_gpu` only by a runner with
  `gpu_count > 0`. The oldest trial (lowest id) goes first.
- A claim sets `status=leased`, `runner_id`, `attempt += 1`, `started_at=now` and
  `lease_expires_at = now + lease_s`. The pair (runner_id, attempt) names the lease.
- Heartbeat, lock-for-report and give-back must name the current lease of a `leased` trial;
  anything else raises `StaleLease` (the API answers 409 and the runner kills its trial). A trial
  id that does not exist raises `TrialNotFound`.
- A heartbeat moves the deadline to `now + lease_s` and notes what the trial's status line
  shows (`LIVE_FIELDS`: its memory, steps and floors, contract/live.py), each None where the runner
  did not say; a trial back in the queue has none of them, so the next lease starts blank.
- When the API starts it renews every lease to at least `now + lease_s` (`renew_leases`):
  nobody could heartbeat or report while it was down, so an outage of any length costs no
  runner its lease, and a report spooled on the runner is taken once the API is back.
- A refusal (StaleLease) names the caller's own lease and never the holder's runner or
  attempt. Which runner a request comes from is the API's business (its runner secret,
  service/api/routes/runners.py); the queue trusts the runner id it is given.
- Giving a lease back (runner shutdown) or a runner leaving requeues its trials with
  `attempt -= 1`: an orderly return is not a failed attempt.
- The reaper takes leased trials whose deadline passed: below `max_attempts` they are queued
  again (runner and lease cleared; the next claim is the next attempt); at `max_attempts` every
  attempt has expired, so the trial is finished: `done`, verdict `error`, with the reason.
- Local jobs (`Job.local`, made by `bisect-cli run`) belong to the process that runs them: no
  runner can claim their trials (`claim`) and the service's maintenance never advances them.
  That process leases its own trials with `claim_local`, under the same conditional UPDATE,
  with no deadline (nothing else could take them over).
- An infrastructure failure (the runner's report says one: `TrialReport.infrastructure`, a
  `contract.wire.Cause` such as a host the egress rule refused, an index's HTTP error, uv's
  timeout, a full disk) is no outcome of the release (`infrastructure_failed`, under the
  lease like a report): the failure is appended to the trial's `infra_failures` with its
  runner and attempt, and below `INFRA_TRIES` failures the trial is queued again with
  `attempt -= 1` (the script's attempts are not spent) and `infra_runner` = the runner that
  failed it. At `INFRA_TRIES` it is finished: `done`, no verdict, `error` the failure's
  message; the scheduler then ends the job naming the cause (service/scheduler.py), unless
  it was a traced run, which is never a verdict and ends only its tracing.
- Another runner first: `claim` passes over a trial whose latest infrastructure failure was
  on the claiming runner while another runner that could take it is live (active, seen
  within `LIVE_S`, with a GPU when the job needs one), busy or idle: it waits for that one.
  With no such runner the same runner takes it again (one runner, or `bisect-cli run`).
- Cancelling a job's open trials (`cancel_open_trials`) is one conditional UPDATE of its queued
  and leased trials, so a trial completed meanwhile keeps its result; a leased one's runner gets
  409 at its next heartbeat.
- `job_lock` holds a job against concurrent advances and cancels (service/scheduler.py): the
  job row `FOR UPDATE` on Postgres (across processes), a process lock on SQLite (whose writers
  are serialized anyway, but whose reads are not).

Concurrency
-----------
Every change is one conditional UPDATE whose WHERE restates the rule (e.g. "still leased to this
runner and attempt"), so there is no read-then-write window on either backend; a rowcount of 0
means the rule did not hold, and only then do we read the row to say why.

Postgres: a claim is `UPDATE trial SET ... WHERE id = (SELECT trial.id ... ORDER BY id LIMIT 1
FOR UPDATE OF trial SKIP LOCKED) RETURNING id`. Concurrent claimers skip rows another transaction
holds instead of waiting for it, so they never block each other and never get the same row (a row
committed as leased meanwhile fails the re-checked WHERE). `OF trial` keeps the job row unlocked.

SQLite: the same statement; SQLAlchemy drops FOR UPDATE there. We rely on SQLite's single
writer instead of BEGIN IMMEDIATE or a process lock: a writing statement takes the database write
lock before it reads (and WAL refuses a writer whose snapshot is stale, retrying while the
transaction has not started), so the claim's SELECT and UPDATE run as one serialized step and
other claimers wait on the busy timeout (30 s, `service.db.make_engine`). That holds across
threads and processes alike, and needs no change to how the driver begins transactions
(BEGIN IMMEDIATE would need `isolation_level=None` on the engine).

Each function commits, so each is one transaction - except `lock_for_report`, which leaves the
transaction open holding the trial's row lock (Postgres) or the write lock (SQLite) so the caller
records the report under the lease it checked and then commits, and `cancel_open_trials` and
`job_lock`, which run inside the caller's transaction.

A completion (service/api/routes/runners.py) is: `renew_for_report` (one short conditional
UPDATE, committed: the lease is current and is now held for minutes, so the reaper leaves it
alone while the report is judged), then the classification of the report with no lock and no
transaction held (the slow part: a 20,000-sample series, and in a fresh process scipy's
import), then `lock_for_report`, the stored rows and commit (the short part). The lease may
still change between the two (a cancel); the lock's conditional UPDATE re-checks it, so a
report is stored only under the lease it names, exactly as before, and no other request
waits on the write lock while a report is classified.
"""

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, false, func, or_, update
from sqlmodel import Session, col, select

from contract.errors import Conflict
from contract.live import LIVE_FIELDS
from engine.verdicts import Verdict
from service.models import Job, JobStatus, Runner, Trial, TrialStatus, utcnow
from service.store import TrialNotFound

OPEN_JOBS = (JobStatus.QUEUED, JobStatus.RUNNING)
# A trial's tries when each fails for the infrastructure (its first and two more): enough
# for a runner restarted or an index's passing 503, few enough that a rule that refuses
# every runner ends the job within minutes.
INFRA_TRIES = 3
# A runner seen within this many seconds is live (its long polls and heartbeats touch it).
LIVE_S = 60.0

# Back in the queue with no trace of the lease; the attempt count is the caller's choice.
_REQUEUE: dict[str, Any] = {
    "status": TrialStatus.QUEUED,
    "runner_id": None,
    "lease_expires_at": None,
    "started_at": None,
    **dict.fromkeys(LIVE_FIELDS),  # the status line's fields, `Trial` columns too
}


# SQLite: one process lock for every job (the service is one process on SQLite).
_sqlite_lock = threading.RLock()


class StaleLease(Conflict):
    """The runner's lease on a trial is no longer current (HTTP 409)."""


def _update(*where: Any, **values: Any) -> Any:
    # Core-style UPDATE: we reload what we return, so skip the ORM's in-session sync.
    return update(Trial).where(*where).values(**values).execution_options(synchronize_session=False)


def _holds(trial_id: int, runner_id: str, attempt: int) -> tuple[Any, ...]:
    return (
        Trial.id == trial_id,
        Trial.status == TrialStatus.LEASED,
        Trial.runner_id == runner_id,
        Trial.attempt == attempt,
    )


def _load(session: Session, trial_id: int) -> Trial:
    trial = session.get(Trial, trial_id, populate_existing=True)
    if trial is None:
        raise TrialNotFound(f"trial {trial_id} not found")
    return trial


def _why_stale(session: Session, trial_id: int, runner_id: str, attempt: int) -> StaleLease:
    session.rollback()  # release the lock the failed UPDATE may have taken (SQLite)
    trial = _load(session, trial_id)
    if trial.status == TrialStatus.CANCELLED:
        return StaleLease(f"trial {trial_id} was cancelled")
    if trial.status == TrialStatus.LEASED:
        # Never name the holder: a runner learns nothing about another runner's lease.
        return StaleLease(
            f"trial {trial_id} is held by another lease, not runner {runner_id} attempt {attempt}"
        )
    return StaleLease(
        f"trial {trial_id} is {trial.status}, not leased to runner {runner_id} attempt {attempt}"
    )


def _checked(
    session: Session, trial_id: int, runner_id: str, attempt: int, values: dict[str, Any]
) -> None:
    """Apply `values` if the lease is current, else raise StaleLease."""
    result = session.exec(_update(*_holds(trial_id, runner_id, attempt), **values))
    if result.rowcount != 1:
        raise _why_stale(session, trial_id, runner_id, attempt)


def claim(
    session: Session, runner: Runner, *, lease_s: float, now: datetime | None = None
) -> Trial | None:
    """Lease the oldest claimable trial to `runner`, or None when there is none."""
    now = now or utcnow()
    pick = (
        select(Trial.id)
        .join(Job, col(Job.id) == Trial.job_id)
        .where(
            Trial.status == TrialStatus.QUEUED,
            col(Job.status).in_(OPEN_JOBS),
            col(Job.local) == false(),
        )
        .order_by(col(Trial.id))
        .limit(1)
        .with_for_update(of=Trial, skip_locked=True)
    )
    if runner.gpu_count <= 0:
        pick = pick.where(col(Job.requires_gpu) == false())
    pick = pick.where(_not_passed_over(runner, now))
    stmt = _update(
        col(Trial.id) == pick.scalar_subquery(),
        status=TrialStatus.LEASED,
        runner_id=runner.id,
        attempt=Trial.attempt + 1,
        started_at=now,
        lease_expires_at=now + timedelta(seconds=lease_s),
    ).returning(Trial.id)
    trial_id = session.exec(stmt).scalar_one_or_none()
    session.commit()
    return None if trial_id is None else _load(session, trial_id)


def _not_passed_over(runner: Runner, now: datetime) -> Any:
    """The claim's condition of "another runner first" (the module docstring): the trial did
    not last fail on `runner` for the infrastructure, or no other live runner could take it."""
    other = (
        select(Runner.id)
        .where(
            col(Runner.active),
            col(Runner.last_seen) >= now - timedelta(seconds=LIVE_S),
            col(Runner.id) != runner.id,
            or_(col(Job.requires_gpu) == false(), col(Runner.gpu_count) > 0),
        )
        .correlate(Job)
    )
    return or_(
        col(Trial.infra_runner).is_(None),
        col(Trial.infra_runner) != runner.id,
        ~exists(other),
    )


def heartbeat(
    session: Session,
    trial_id: int,
    runner_id: str,
    attempt: int,
    *,
    lease_s: float,
    live: Mapping[str, int | None] | None = None,
    now: datetime | None = None,
) -> Trial:
    """Extend the lease to now + lease_s, noting the trial's status line (`live`, by the
    names in `LIVE_FIELDS`; a name it lacks is None)."""
    deadline = (now or utcnow()) + timedelta(seconds=lease_s)
    noted = {name: (live or {}).get(name) for name in LIVE_FIELDS}
    _checked(session, trial_id, runner_id, attempt, {"lease_expires_at": deadline, **noted})
    session.commit()
    return _load(session, trial_id)


def claim_local(
    session: Session, job: Job, runner_id: str = "local", now: datetime | None = None
) -> Trial | None:
    """Lease the oldest queued trial of a local job to its own process (no deadline)."""
    now = now or utcnow()
    pick = (
        select(Trial.id)
        .where(Trial.job_id == job.id, Trial.status == TrialStatus.QUEUED)
        .order_by(col(Trial.id))
        .limit(1)
    )
    stmt = _update(
        col(Trial.id) == pick.scalar_subquery(),
        Trial.status == TrialStatus.QUEUED,
        status=TrialStatus.LEASED,
        runner_id=runner_id,
        attempt=Trial.attempt + 1,
        started_at=now,
    ).returning(Trial.id)
    trial_id = session.exec(stmt).scalar_one_or_none()
    session.commit()
    return None if trial_id is None else _load(session, trial_id)


def renew_for_report(
    session: Session, trial_id: int, runner_id: str, attempt: int, *, hold_s: float
) -> Trial:
    """Check the lease and extend it to now + hold_s, committed (a heartbeat without a
    memory figure): the report is then classified with no lock held, and the reaper must
    not take the trial meanwhile, however slow that is (a cold scipy import alone can take
    seconds), so `hold_s` is far longer than a lease. StaleLease when the lease is not
    current. The write re-checks the lease under `lock_for_report`; should the request die
    before it, the runner sends its spooled report again within the hold."""
    deadline = utcnow() + timedelta(seconds=hold_s)
    _checked(session, trial_id, runner_id, attempt, {"lease_expires_at": deadline})
    session.commit()
    return _load(session, trial_id)


def renew_leases(session: Session, *, lease_s: float, now: datetime | None = None) -> int:
    """Give every leased trial at least `lease_s` more (the API is starting): while it was
    down no runner could heartbeat or report, and a runner still holding its finished report
    must not find the trial reaped the moment the API is back. Returns how many."""
    deadline = (now or utcnow()) + timedelta(seconds=lease_s)
    stmt = _update(
        Trial.status == TrialStatus.LEASED,
        col(Trial.lease_expires_at) < deadline,
        lease_expires_at=deadline,
    )
    count = session.exec(stmt).rowcount  # type: ignore[call-overload]
    session.commit()
    return count


def lock_for_report(session: Session, trial_id: int, runner_id: str, attempt: int) -> Trial:
    """Check the lease and lock the trial for the caller's report; does NOT commit.

    The lock is a no-op UPDATE under the lease condition: on Postgres it holds the row (like
    FOR UPDATE; the reaper and claims skip it), on SQLite it holds the write lock. Either way
    nobody can reap or reclaim the trial until the caller commits the report (or rolls back).
    On SQLite that lock stops every writer, so do slow work (analysis) before calling this.
    On StaleLease the transaction has been rolled back.
    """
    _checked(session, trial_id, runner_id, attempt, {"status": Trial.status})
    return _load(session, trial_id)


def infrastructure_failed(
    session: Session, trial: Trial, failure: dict[str, Any], *, now: datetime | None = None
) -> Trial:
    """Record an infrastructure failure of `trial`'s current lease (`failure`: the runner's
    `Failure`, dumped); queue it again, or finish it at `INFRA_TRIES` (the module docstring).
    Commits; returns the trial as stored now. StaleLease when the lease is not current."""
    assert trial.id is not None and trial.runner_id is not None
    runner_id, attempt = trial.runner_id, trial.attempt
    failures = [*trial.infra_failures, {**failure, "runner": runner_id, "attempt": attempt}]
    again = len(failures) < INFRA_TRIES
    values: dict[str, Any] = {"infra_failures": failures, "infra_runner": runner_id}
    if again:
        values |= _REQUEUE | {"attempt": Trial.attempt - 1}
    else:
        values |= {
            "status": TrialStatus.DONE,
            "finished_at": now or utcnow(),
            "lease_expires_at": None,
            "error": failure.get("message"),
        }
    _checked(session, trial.id, runner_id, attempt, values)
    session.commit()
    return _load(session, trial.id)


def infrastructure_spent(trial: Trial) -> bool:
    """Whether `trial` ended on its infrastructure failures (`INFRA_TRIES` of them)."""
    return trial.status == TrialStatus.DONE and len(trial.infra_failures or []) >= INFRA_TRIES


def give_back(session: Session, trial_id: int, runner_id: str, attempt: int) -> Trial:
    """The runner returns its lease unfinished: queued again without using up an attempt."""
    _checked(session, trial_id, runner_id, attempt, _REQUEUE | {"attempt": Trial.attempt - 1})
    session.commit()
    return _load(session, trial_id)


def release_runner(session: Session, runner_id: str) -> int:
    """The runner leaves: it goes inactive and its leases return like give_back. Returns count."""
    held = (Trial.runner_id == runner_id, Trial.status == TrialStatus.LEASED)
    count = session.exec(_update(*held, **_REQUEUE, attempt=Trial.attempt - 1)).rowcount
    session.exec(update(Runner).where(col(Runner.id) == runner_id).values(active=False))
    session.commit()
    return count


def reap(session: Session, *, max_attempts: int = 3, now: datetime | None = None) -> list[Trial]:
    """Requeue or finish (verdict error) leased trials whose deadline has passed."""
    now = now or utcnow()
    expired = (
        Trial.status == TrialStatus.LEASED,
        col(Trial.lease_expires_at) < now,
    )
    # SKIP LOCKED: a trial being finished right now (finish holds its row) is not expired.
    rows = session.exec(
        select(Trial.id, Trial.attempt, Trial.runner_id)
        .where(*expired)
        .order_by(col(Trial.id))
        .with_for_update(of=Trial, skip_locked=True)
    ).all()
    reaped = []
    for trial_id, attempt, runner_id in rows:
        if attempt < max_attempts:
            values = _REQUEUE
        else:
            reason = f"lease expired {attempt} times (last runner {runner_id})"
            values = {
                "status": TrialStatus.DONE,
                "verdict": Verdict.ERROR,
                "error": reason,
                "analysis": {"reason": reason},
                "finished_at": now,
                "lease_expires_at": None,
            }
        # Re-check: on SQLite the SELECT above locked nothing and a heartbeat may have landed.
        stmt = _update(Trial.id == trial_id, Trial.attempt == attempt, *expired, **values)
        if session.exec(stmt).rowcount == 1:
            reaped.append(trial_id)
    session.commit()
    return [_load(session, trial_id) for trial_id in reaped]


def queue_depth(session: Session) -> int:
    """Queued trials that a runner could claim now (their job is still open)."""
    query = (
        select(func.count())
        .select_from(Trial)
        .join(Job, col(Job.id) == Trial.job_id)
        .where(
            Trial.status == TrialStatus.QUEUED,
            col(Job.status).in_(OPEN_JOBS),
            col(Job.local) == false(),
        )
    )
    return session.exec(query).one()


def touch_runner(session: Session, runner_id: str, now: datetime | None = None) -> Runner | None:
    """Record that the runner was seen; None if it is not registered."""
    stmt = update(Runner).where(col(Runner.id) == runner_id).values(last_seen=now or utcnow())
    touched = session.exec(stmt.execution_options(synchronize_session=False)).rowcount
    session.commit()
    return session.get(Runner, runner_id, populate_existing=True) if touched else None


def live_runners(
    session: Session, *, within_s: float = LIVE_S, now: datetime | None = None
) -> list[Runner]:
    """Active runners seen within the last `within_s` seconds, by id."""
    since = (now or utcnow()) - timedelta(seconds=within_s)
    query = (
        select(Runner)
        .where(col(Runner.active), col(Runner.last_seen) >= since)
        .order_by(col(Runner.id))
    )
    return list(session.exec(query))


def cancel_open_trials(session: Session, job: Job) -> int:
    """Cancel the job's queued and leased trials in the caller's transaction; returns count."""
    stmt = _update(
        col(Trial.job_id) == job.id,
        col(Trial.status).in_([TrialStatus.QUEUED, TrialStatus.LEASED]),
        status=TrialStatus.CANCELLED,
        lease_expires_at=None,
    )
    return session.exec(stmt).rowcount  # type: ignore[call-overload]


@contextmanager
def job_lock(session: Session, job: Job) -> Iterator[Job]:
    """Hold `job` against concurrent advances and cancels; refreshes it from the database.

    The lock ends with the caller's commit (Postgres) or the block (SQLite), so
    commit inside the block.
    """
    sqlite = session.get_bind().dialect.name == "sqlite"
    if sqlite:
        _sqlite_lock.acquire()
    try:
        query = select(Job).where(Job.id == job.id).with_for_update()
        session.exec(query.execution_options(populate_existing=True)).one()
        yield job
    finally:
        if sqlite:
            _sqlite_lock.release()
