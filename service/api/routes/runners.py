"""The runner protocol (runner tokens): register, lease, heartbeat, complete, return, leave.

Every lease rule is service/queue.py's; its errors become HTTP statuses in
service/api/errors.py: `StaleLease` is 409 (the runner kills its trial), an unknown
trial or runner 404.
"""

import asyncio
import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.engine import Engine
from sqlmodel import Session

from runners.errors import InvalidInput, NotFound
from runners.wire import (
    Heartbeat,
    HeartbeatAck,
    Lease,
    LeaseReturn,
    RunnerRegister,
    RunnerRegistered,
    TrialReport,
)
from service import queue
from service.api.deps import EngineDep, RunnerAuth, SessionDep, SettingsDep
from service.api.schemas import CompleteAck, ReturnAck
from service.models import Candidate, Job, Runner
from service.scheduler import advance, slots_for
from service.settings import Settings
from service.specs import trial_spec
from service.trials import record_report

router = APIRouter(tags=["runners"], dependencies=[RunnerAuth])

POLL_S = 0.2
MAX_WAIT_S = 60


class RunnerNotRegistered(NotFound):
    """The runner id is unknown or has left: the runner registers again."""

    def __init__(self, runner_id: str) -> None:
        super().__init__(f"runner {runner_id} is not registered; register again")


@router.post("/runners", status_code=status.HTTP_201_CREATED, response_model=RunnerRegistered)
def register_runner(
    body: RunnerRegister, session: SessionDep, settings: SettingsDep
) -> RunnerRegistered:
    """A runner joins with its capabilities; the answer names it and sets its lease timing."""
    runner = Runner(
        id=f"r-{secrets.token_hex(6)}",
        name=body.name,
        capabilities=body.capabilities.model_dump(mode="json"),
        labels=dict(body.labels),
        gpu_count=body.capabilities.gpu_count,
    )
    session.add(runner)
    session.commit()
    return RunnerRegistered(
        runner_id=runner.id, lease_s=settings.lease_s, heartbeat_s=settings.heartbeat_s
    )


def _try_lease(engine: Engine, settings: Settings, runner_id: str) -> Lease | None:
    with Session(engine) as session:
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
            trial=trial_spec(job, candidate, trial),
            lease_expires_at=trial.lease_expires_at,
            heartbeat_s=settings.heartbeat_s,
        )


@router.post(
    "/runners/{runner_id}/lease",
    response_model=Lease,
    responses={
        204: {"description": "no work within `wait` seconds"},
        404: {"description": "register again"},
    },
)
async def lease_trial(
    runner_id: str,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="long poll, seconds")] = 20,
) -> Lease | Response:
    """Long poll for a trial: the queue is polled every 0.2 s until a claim succeeds or
    `wait` seconds pass (204). Async so that waiting runners hold no worker thread."""
    deadline = time.monotonic() + wait
    while True:
        lease = await run_in_threadpool(_try_lease, engine, settings, runner_id)
        if lease is not None:
            return lease
        left = deadline - time.monotonic()
        if left <= 0 or await request.is_disconnected():
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        await asyncio.sleep(min(POLL_S, left))


@router.post(
    "/trials/{trial_id}/heartbeat",
    response_model=HeartbeatAck,
    responses={409: {"description": "stale or cancelled: kill the trial"}},
)
def heartbeat(
    trial_id: int, body: Heartbeat, session: SessionDep, settings: SettingsDep
) -> HeartbeatAck:
    """Extend the lease by lease_s. 409 when the lease is no longer this runner's."""
    trial = queue.heartbeat(
        session, trial_id, body.runner_id, body.attempt, lease_s=settings.lease_s, rss=body.rss
    )
    queue.touch_runner(session, body.runner_id)
    assert trial.lease_expires_at is not None
    return HeartbeatAck(lease_expires_at=trial.lease_expires_at)


@router.post(
    "/trials/{trial_id}/complete",
    response_model=CompleteAck,
    responses={409: {"description": "stale lease: the result is not recorded"}},
)
def complete(
    trial_id: int, report: TrialReport, session: SessionDep, settings: SettingsDep
) -> CompleteAck:
    """Record the runner's report (samples, verdict) and advance the job, in one request."""
    if report.trial_id != trial_id:
        raise InvalidInput(
            f"the report is for trial {report.trial_id}, not {trial_id}", field="trial_id"
        )
    if not report.runner_id:
        raise InvalidInput("field required", field="runner_id")
    trial = queue.lock_for_report(session, trial_id, report.runner_id, report.attempt)
    job = session.get(Job, trial.job_id)
    candidate = session.get(Candidate, trial.candidate_id)
    assert job is not None and candidate is not None
    verdict = record_report(session, job, candidate, trial, report)
    queue.touch_runner(session, report.runner_id)
    advance(session, job, slots_for(session, job, within_s=settings.runner_live_s))
    return CompleteAck(verdict=None if verdict is None else verdict.value)


@router.post(
    "/trials/{trial_id}/return",
    response_model=ReturnAck,
    responses={409: {"description": "stale lease"}},
)
def return_trial(trial_id: int, body: LeaseReturn, session: SessionDep) -> ReturnAck:
    """Give a lease back unfinished (the runner is stopping): queued again, no attempt used."""
    trial = queue.give_back(session, trial_id, body.runner_id, body.attempt)
    return ReturnAck(trial_id=trial_id, status=trial.status)


@router.delete(
    "/runners/{runner_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={404: {"description": "no such runner"}},
)
def leave(runner_id: str, session: SessionDep) -> Response:
    """The runner leaves; its leases go back to the queue."""
    if session.get(Runner, runner_id) is None:
        raise RunnerNotRegistered(runner_id)
    queue.release_runner(session, runner_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
