"""What callers do to jobs: submit, cancel, bisect again; and the one way a job is moved on.

The API, the status page and the CLI's local reads all call these, so a rule is written
once: who may change a job (`Caller.may_change`, service/access.py), what a submission may
ask (service/policy.py), what cancelling a finished job answers. Errors are the service's
(`contract.errors`: `Forbidden` 403, `Conflict` 409, `InvalidInput` 422, not-found 404);
each adapter turns them into its own answer.

"Bisect again" makes a new job from an old one's options (the script, requirements,
indexes, thresholds), so the old job's evidence is never rewritten:

- `again`: the same range with `repeats` runs per candidate (default one more than before)
  and verdict reuse off, so every candidate is run afresh;
- `again` with `candidate`: the range narrowed to that release and its testable neighbour
  (the one before it; for the range's first release, the one after), also without reuse:
  the bounds check then runs the candidate again against its neighbour and says whether
  the step between them leaks.

Every change that can give a job work (a submission, a finished trial, the maintenance
tick) ends with `advance_job`: one planner step with the slots live runners offer now, and
the job's trial budget. A submission and "bisect again" first pass the owner's limits
(`LimitExceeded` 429, `TooLarge` 413: service/policy.py).
"""

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from contract.errors import Conflict, Forbidden, InvalidInput
from engine.planner import Plan
from service import policy, store
from service.access import Caller
from service.envpolicy import EnvPair
from service.jobs import create_job
from service.models import Job
from service.options import MAX_REPEATS, JobOptions
from service.scheduler import advance, cancel, slots_for
from service.schemas import AgainRequest, JobCreate
from service.settings import Settings
from service.views import readable_job


def advance_job(session: Session, job: Job, settings: Settings) -> Plan:
    """Move `job` one step with the slots of the runners seen within `runner_live_s`, within
    its trial budget (`max_trials_per_job`: a job that needs more stops, service/policy.py)."""
    slots = slots_for(session, job, within_s=settings.runner_live_s)
    hook = settings.webhook_url is not None
    return advance(session, job, slots, budget=settings.max_trials_per_job, operator_webhook=hook)


def _create(
    session: Session,
    settings: Settings,
    request: JobCreate,
    owner: str | None,
    idempotency: str | None = None,
    site: str | None = None,
) -> Job:
    """A new job, if the submission policy allows what it asks and the owner is within the
    deployment's limits (service/policy.py); not yet advanced. `site`: the base URL it was
    submitted through (its webhook's links)."""
    policy.check_submission(request, policy.reach(settings))
    policy.check_webhook(request, settings)
    policy.check_owner_limits(session, settings, owner)
    fetch = policy.fetch_policy(settings)
    return create_job(
        session,
        request,
        fetch=fetch,
        owner=owner,
        idempotency=idempotency,
        max_candidates=settings.max_candidates,
        # Committed with the job: set after, the next query's autoflush would open a write
        # that the advance's SQLite lock then waits behind (a deadlock with maintenance).
        site_url=site,
    )


def submit_job(
    session: Session,
    settings: Settings,
    request: JobCreate,
    owner: str | None,
    idempotency: str | None = None,
    site: str | None = None,
) -> tuple[Job, bool]:
    """(the job, True) for a new submission, advanced; (the first job, False) when this
    `idempotency` digest (service/api/routes/jobs.py) was already used, whatever `request`
    says this time (a retry whose first answer was lost). `site`: see `_create`."""
    first = store.job_by_idempotency(session, idempotency) if idempotency else None
    if first is not None:
        return first, False
    try:
        job = _create(session, settings, request, owner, idempotency, site)
    except IntegrityError:
        # The same key in flight twice: the other request's insert committed first.
        session.rollback()
        first = store.job_by_idempotency(session, idempotency) if idempotency else None
        if first is None:
            raise
        return first, False
    advance_job(session, job, settings)
    return job, True


def cancel_job(
    session: Session, settings: Settings, job_id: int, caller: Caller, reason: str | None = None
) -> Job:
    """Cancel the job: its queued trials are cancelled, leased ones are refused at their next
    heartbeat (409) so their runners kill them. `reason`: the job's message (the
    scheduler's own when None)."""
    job = readable_job(session, job_id, caller)
    if not caller.may_change(job.owner):
        raise Forbidden(f"job {job_id} was submitted by another token")
    hook = settings.webhook_url is not None
    said = {} if reason is None else {"message": reason}  # else the scheduler's own words
    done = cancel(session, job, operator_webhook=hook, **said)
    if not done:
        raise Conflict(f"job {job_id} has already finished ({job.status})")
    return job


def _narrowed(session: Session, job: Job, version: str) -> str:
    candidates = store.candidates_of(session, job)
    index = next((i for i, c in enumerate(candidates) if c.version == version), None)
    if index is None:
        raise InvalidInput(
            f"release {version} is not a candidate of job {job.id}", field="candidate"
        )
    if not candidates[index].testable:
        raise InvalidInput(f"release {version} is untestable here", field="candidate")
    before = [c for c in candidates[:index] if c.testable]
    after = [c for c in candidates[index + 1 :] if c.testable]
    if before:
        return f"{before[-1].version}..{version}"
    if after:
        return f"{version}..{after[0].version}"
    raise InvalidInput(
        f"release {version} has no testable neighbour to run against", field="candidate"
    )


def again_job(
    session: Session,
    settings: Settings,
    job_id: int,
    caller: Caller,
    body: AgainRequest,
    site: str | None = None,
) -> Job:
    """A new job from job `job_id`'s options (see the module docstring); returns it, advanced."""
    job = readable_job(session, job_id, caller)
    if caller.role == "viewer":
        raise Forbidden("a view token can only read")
    options = job.model_dump(include=set(JobOptions.model_fields))
    options["repeats"] = body.repeats or min(job.repeats + 1, MAX_REPEATS)
    options["max_runs"] = max(job.max_runs, options["repeats"])
    options["reuse_verdicts"] = False
    if isinstance(job.env_policy, EnvPair):
        # The two environments are what was asked: no package, no range (`good` and `bad`
        # name the two files). The culprit the search found is `Job.search`, never an
        # option; a row that still holds it in `package` (written before migration 0016
        # moved it out) is asked again without it.
        if body.candidate:
            raise InvalidInput(
                "a --from/--to job is bisected again whole, from its two environments",
                field="candidate",
            )
        options["package"], good_bad = "", ""
    elif body.candidate:
        good_bad = _narrowed(session, job, body.candidate)
    else:
        good_bad = f"{job.good}..{job.bad}"
    request = JobCreate.model_validate({**options, "range": good_bad})
    new = _create(session, settings, request, caller.name, site=site)
    advance_job(session, new, settings)
    return new
