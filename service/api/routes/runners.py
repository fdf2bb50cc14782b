"""The runner protocol (runner tokens): register, lease, heartbeat, complete, return, leave.

Every lease rule is service/queue.py's; its errors become HTTP statuses in
service/http/errors.py: `StaleLease` is 409 (the runner kills its trial), an unknown
trial or runner 404.

Runners are authenticated as themselves: the runner token only opens these endpoints (any
runner holding it could claim to be any other), so registration also returns a per-runner
secret, of which the runner row keeps the sha256 only. Every later request (lease, heartbeat,
complete, return, leave) sends it as `X-Runner-Secret`, and the runner id it names (in the
path or the body) must be the secret's runner: 403 otherwise, before any lease is looked at.
A runner that sends its own id for another runner's trial then meets the lease rules (409,
whose message never names the holder).
"""

import asyncio
import hashlib
import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.engine import Engine
from sqlmodel import Session

from contract.errors import Forbidden, InvalidInput, NotFound
from contract.live import LIVE_FIELDS
from contract.wire import (
    RUNNER_SECRET_HEADER,
    Heartbeat,
    HeartbeatAck,
    Lease,
    LeaseReturn,
    RunnerRegister,
    RunnerRegistered,
    TrialReport,
)
from service import actions, kinds, queue, store
from service.http.deps import EngineDep, RunnerAuth, SessionDep, SettingsDep, TrialIdPath
from service.models import Candidate, Job, Runner
from service.schemas import CompleteAck, ReturnAck
from service.settings import Settings
from service.specs import trial_spec
from service.trials import judge, record_report

router = APIRouter(tags=["runners"], dependencies=[RunnerAuth])

POLL_S = 0.2
MAX_WAIT_S = 60
# While a completion's report is classified (outside the lock) its lease is held this long:
# the reaper must not take the trial from under a report that is being judged.
REPORT_HOLD_S = 300.0


class RunnerNotRegistered(NotFound):
    """The runner id is unknown or has left: the runner registers again."""

    def __init__(self, runner_id: str) -> None:
        super().__init__(f"runner {runner_id} is not registered; register again")


# The secret a runner sends on every request after registering (None when it sends none).
SecretDep = Annotated[
    str | None,
    Header(alias=RUNNER_SECRET_HEADER, max_length=200, description="from POST /runners"),
]


def secret_hash(secret: str) -> str:
    # A 256-bit random secret needs no salt or stretching: sha256 cannot be reversed.
    return hashlib.sha256(secret.encode()).hexdigest()


def authenticate(session: Session, secret: str | None, runner_id: str) -> Runner:
    """The runner `runner_id`, if `secret` is its secret: else 403 (404 for an unknown id)."""
    if not secret:
        raise Forbidden(f"{RUNNER_SECRET_HEADER}: missing; send the secret POST /runners returned")
    runner = store.runner_by_secret_hash(session, secret_hash(secret))
    if runner is None:
        if session.get(Runner, runner_id) is None:
            raise RunnerNotRegistered(runner_id)
        raise Forbidden(f"{RUNNER_SECRET_HEADER}: not the secret of runner {runner_id}")
    if runner.id != runner_id:
        raise Forbidden(
            f"runner_id: {runner_id} is not the runner this {RUNNER_SECRET_HEADER} was issued to"
        )
    return runner


@router.post("/runners", status_code=status.HTTP_201_CREATED, response_model=RunnerRegistered)
def register_runner(
    body: RunnerRegister, session: SessionDep, settings: SettingsDep
) -> RunnerRegistered:
    """A runner joins with its capabilities; the answer names it, sets its lease timing and
    gives it its secret (shown this once: only its hash is stored)."""
    secret = secrets.token_urlsafe(32)
    runner = Runner(
        id=f"r-{secrets.token_hex(6)}",
        name=body.name,
        capabilities=body.capabilities.model_dump(mode="json"),
        labels=dict(body.labels),
        gpu_count=body.capabilities.gpu_count,
        secret_hash=secret_hash(secret),
    )
    session.add(runner)
    session.commit()
    return RunnerRegistered(
        runner_id=runner.id,
        runner_secret=secret,
        lease_s=settings.lease_s,
        heartbeat_s=settings.heartbeat_s,
    )


def _try_lease(
    engine: Engine, settings: Settings, runner_id: str, secret: str | None
) -> Lease | None:
    with Session(engine) as session:
        authenticate(session, secret, runner_id)
        runner = queue.touch_runner(session, runner_id)
        if runner is None or not runner.active:
            raise RunnerNotRegistered(runner_id)
        trial = queue.claim(session, runner, lease_s=settings.lease_s)
        if trial is None:
            return None
        job = session.get(Job, trial.job_id)
        candidate = session.get(Candidate, trial.candidate_id)
        assert job is not None and candidate is not None and trial.lease_expires_at is not None
        return Lease(
            trial=trial_spec(job, candidate, trial, store.trials_of(session, job)),
            lease_expires_at=trial.lease_expires_at,
            heartbeat_s=settings.heartbeat_s,
        )


@router.post(
    "/runners/{runner_id}/lease",
    response_model=Lease,
    responses={
        204: {"description": "no work within `wait` seconds"},
        403: {"description": "the secret is not this runner's"},
        404: {"description": "register again"},
    },
)
async def lease_trial(
    runner_id: str,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    secret: SecretDep = None,
    wait: Annotated[
        float, Query(ge=0, le=MAX_WAIT_S, allow_inf_nan=False, description="long poll, seconds")
    ] = 20,
) -> Lease | Response:
    """Long poll for a trial: the queue is polled every 0.2 s until a claim succeeds or
    `wait` seconds pass (204). Async so that waiting runners hold no worker thread."""
    deadline = time.monotonic() + wait
    while True:
        lease = await run_in_threadpool(_try_lease, engine, settings, runner_id, secret)
        if lease is not None:
            return lease
        left = deadline - time.monotonic()
        if left <= 0 or await request.is_disconnected():
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        await asyncio.sleep(min(POLL_S, left))


STALE = {
    403: {"description": "the runner id is not the secret's runner"},
    409: {"description": "stale or cancelled lease: kill the trial, drop its report"},
}


@router.post("/trials/{trial_id}/heartbeat", response_model=HeartbeatAck, responses=STALE)
def heartbeat(
    trial_id: TrialIdPath,
    body: Heartbeat,
    session: SessionDep,
    settings: SettingsDep,
    secret: SecretDep = None,
) -> HeartbeatAck:
    """Extend the lease by lease_s. 409 when the lease is no longer this runner's."""
    authenticate(session, secret, body.runner_id)
    live = body.model_dump(include=set(LIVE_FIELDS))
    trial = queue.heartbeat(
        session, trial_id, body.runner_id, body.attempt, lease_s=settings.lease_s, live=live
    )
    queue.touch_runner(session, body.runner_id)
    assert trial.lease_expires_at is not None
    return HeartbeatAck(lease_expires_at=trial.lease_expires_at)


@router.post("/trials/{trial_id}/complete", response_model=CompleteAck, responses=STALE)
def complete(
    trial_id: TrialIdPath,
    report: TrialReport,
    session: SessionDep,
    settings: SettingsDep,
    secret: SecretDep = None,
) -> CompleteAck:
    """Record the runner's report (samples, verdict) and advance the job, in one request.

    The report is classified before the trial is locked (service/queue.py, Concurrency):
    a long series keeps no other request waiting on the write lock."""
    if report.trial_id != trial_id:
        raise InvalidInput(
            f"the report is for trial {report.trial_id}, not {trial_id}", field="trial_id"
        )
    if not report.runner_id:
        raise InvalidInput("field required", field="runner_id")
    authenticate(session, secret, report.runner_id)
    trial = queue.renew_for_report(
        session,
        trial_id,
        report.runner_id,
        report.attempt,
        hold_s=max(REPORT_HOLD_S, settings.lease_s),
    )
    job = session.get(Job, trial.job_id)
    assert job is not None
    # An infrastructure failure is no run to judge (service/trials.py `record_report`).
    judged = judge(job, report) if kinds.judged(trial) and not report.infrastructure else None
    session.rollback()  # no transaction (and on SQLite no read snapshot) held while judging
    trial = queue.lock_for_report(session, trial_id, report.runner_id, report.attempt)
    job = session.get(Job, trial.job_id)
    candidate = session.get(Candidate, trial.candidate_id)
    assert job is not None and candidate is not None
    verdict = record_report(session, job, candidate, trial, report, judged)
    queue.touch_runner(session, report.runner_id)
    actions.advance_job(session, job, settings)
    return CompleteAck(verdict=None if verdict is None else verdict.value)


@router.post("/trials/{trial_id}/return", response_model=ReturnAck, responses=STALE)
def return_trial(
    trial_id: TrialIdPath, body: LeaseReturn, session: SessionDep, secret: SecretDep = None
) -> ReturnAck:
    """Give a lease back unfinished (the runner is stopping): queued again, no attempt used."""
    authenticate(session, secret, body.runner_id)
    trial = queue.give_back(session, trial_id, body.runner_id, body.attempt)
    return ReturnAck(trial_id=trial_id, status=trial.status)


@router.delete(
    "/runners/{runner_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={
        403: {"description": "the secret is not this runner's"},
        404: {"description": "no such runner"},
    },
)
def leave(runner_id: str, session: SessionDep, secret: SecretDep = None) -> Response:
    """The runner leaves; its leases go back to the queue."""
    authenticate(session, secret, runner_id)
    queue.release_runner(session, runner_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
