"""The pins every candidate of a job is held at, resolved on a runner.

Resolving a requirement set can build sdists (their build backends are arbitrary code),
so the API server never does it: a job that needs pins (`PinState.PENDING`, set at
creation for the `ResolvedAt` environment policy, service/envpolicy.py; not as released,
not with its own pins from `--base-env` or `--from/--to`) gets one *resolve trial* for its
good bound before anything else runs. A runner resolves it (`uv pip compile`, sandboxed
like any build) and reports the pins, which become `Job.constraints`; every candidate is
then built with them as constraints, falling back to free resolution where they do not fit.

Rules, in the order `pending` applies them:

1. A job whose pins are not pending goes on at once.
2. An earlier job resolved exactly the same requirement set (`pin_key`: the good bound's
   environment spec without pins) and the job reuses verdicts: its pins are copied, as
   verdict reuse copies verdicts (service/reuse.py), so an identical job can be answered
   from earlier results at once. `reuse_verdicts=False` resolves afresh.
3. No resolve trial yet: queue one for the good bound (candidate 0) and wait.
3. The resolve trial is queued or leased: wait.
4. It is done but its pins were never recorded (the reaper finished it after
   `max_attempts` expired leases): the pins failed, with the trial's error as the note.
   A recorded report settles the state in `record` instead.
"""

import hashlib
import json
from typing import Any

from sqlmodel import Session, col, select

from contract.wire import TrialReport
from service import kinds, store
from service.envpolicy import AsReleased, BaseEnv, EnvPair, EnvPolicy, ResolvedAt
from service.models import Candidate, Job, PinState, Trial, TrialKind, TrialStatus
from service.specs import env_spec

FAILED_NOTE = "no pins from the good bound (candidates resolve freely): {reason}"


def initial_state(policy: EnvPolicy) -> PinState:
    """Where a new job's pins stand under its environment policy (service/envpolicy.py)."""
    match policy:
        case ResolvedAt():
            return PinState.PENDING  # resolved on a runner, by the resolve trial
        case BaseEnv():
            return PinState.RESOLVED  # the user's file is the pins: nothing to resolve
        case AsReleased() | EnvPair():
            return PinState.NONE  # no shared pins / each mix holds its own


def pending(session: Session, job: Job, trials: list[Trial]) -> bool:
    """True while candidates must wait for the pins (queues the resolve trial if needed)."""
    if job.pin_state != PinState.PENDING:
        return False
    if _reuse(session, job):
        return False
    resolving = kinds.of(TrialKind.RESOLVE, trials)
    live = [t for t in resolving if t.status in (TrialStatus.QUEUED, TrialStatus.LEASED)]
    if live:
        return True
    done = [t for t in resolving if t.status == TrialStatus.DONE]
    if done:
        _failed(job, done[-1].error or "the resolve trial ended without pins")
        session.add(job)
        return False
    good = session.exec(_good_bound(job)).one()
    assert job.id is not None
    number = store.next_trial_number(session, job.id)
    session.add(Trial(job_id=job.id, candidate_id=good.id, kind=TrialKind.RESOLVE, number=number))
    return True


def pin_key(job: Job, good: Candidate) -> str:
    """What decides the pins: the good bound's environment spec, before any pins."""
    spec = env_spec(job, good, resolving=True).model_copy(update={"constraints": []})
    blob = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _reuse(session: Session, job: Job) -> bool:
    if not job.reuse_verdicts:
        return False
    good = session.exec(_good_bound(job)).one()
    job.pin_key = job.pin_key or pin_key(job, good)
    earlier = session.exec(
        select(Job)
        .where(
            col(Job.pin_key) == job.pin_key,
            col(Job.pin_state) == PinState.RESOLVED,
            col(Job.id) < job.id,
        )
        .order_by(col(Job.id).desc())
        .limit(1)
    ).first()
    session.add(job)
    if earlier is None:
        return False
    job.constraints = list(earlier.constraints)
    job.pin_state = PinState.RESOLVED
    return True


def _good_bound(job: Job) -> Any:
    return select(Candidate).where(Candidate.job_id == job.id, Candidate.position == 0)


def _failed(job: Job, reason: str) -> None:
    job.pin_state = PinState.FAILED
    note = FAILED_NOTE.format(reason=reason)
    job.message = "\n".join(filter(None, [job.message, note]))


def record(job: Job, report: TrialReport) -> None:
    """Settle the job's pins from a resolve trial's report (the caller commits)."""
    if job.pin_state != PinState.PENDING:
        return
    if report.env.ok and report.pins is not None:
        job.constraints = list(report.pins)
        job.pin_state = PinState.RESOLVED
    else:
        _failed(job, report.env.error or report.error or "the runner reported no pins")
