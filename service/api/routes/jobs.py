"""Jobs: submit, list, show, cancel (API tokens)."""

import hashlib
import re
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response, status
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from contract.errors import Conflict, Forbidden, InvalidInput
from contract.wire import API_PREFIX, IDEMPOTENCY_HEADER
from service import policy, store
from service.api.routes.trials import trial_public
from service.http.deps import Caller, ReaderDep, SessionDep, SettingsDep, WriterDep
from service.jobs import create_job
from service.models import Job, JobStatus, TrialKind, TrialStatus
from service.report import build_report, with_progress
from service.scheduler import advance, cancel, slots_for
from service.schemas import (
    JobCreate,
    JobCreated,
    JobPage,
    JobPublic,
    JobSummary,
    Progress,
    RunningTrial,
    TrialPublic,
)
from service.settings import Settings

router = APIRouter(prefix="/jobs", tags=["jobs"])


def job_url(request: Request, settings: Settings, job_id: int) -> str:
    base = (settings.public_url or str(request.base_url)).rstrip("/")
    return f"{base}{API_PREFIX}/jobs/{job_id}"


def readable_job(session: Session, job_id: int, caller: Caller) -> Job:
    """The job, if this caller may see it; another token's job is as good as absent (404)."""
    job = store.job(session, job_id)
    if not caller.may_read(job.owner):
        raise store.JobNotFound(f"job {job_id} not found")
    return job


def job_public(session: Session, job: Job) -> JobPublic:
    candidates = store.candidates_of(session, job)
    trials = store.trials_of(session, job)
    runs = [t for t in trials if t.kind == TrialKind.RUN]
    count = {s: sum(1 for t in runs if t.status == s) for s in TrialStatus}
    version = {c.id: c.version for c in candidates}
    progress = Progress(
        candidates=len(candidates),
        judged=sum(1 for c in candidates if c.verdict is not None),
        trials_done=count[TrialStatus.DONE],
        trials_running=count[TrialStatus.LEASED],
        trials_queued=count[TrialStatus.QUEUED],
        running=[
            RunningTrial(
                trial=t.number,
                trial_id=t.id,  # type: ignore[arg-type]
                version=version[t.candidate_id],
                runner=t.runner_id,
                attempt=t.attempt,
                rss=t.rss,
            )
            for t in runs
            if t.status == TrialStatus.LEASED
        ],
    )
    return with_progress(build_report(job, candidates, trials), progress, job)


# Printable ASCII, no spaces: a UUID, a ULID, a CI run id.
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=IDEMPOTENCY_HEADER,
        description="names the submission: a repeat (same token) returns the first job, 200",
    ),
]


def idempotency_digest(caller: Caller, key: str | None) -> str | None:
    """sha256 of (caller, key): keys are scoped to the token that sent them."""
    if key is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidInput(
            "must be 1 to 200 printable ASCII characters without spaces", field=IDEMPOTENCY_HEADER
        )
    return hashlib.sha256(f"{caller.role}\n{caller.name or ''}\n{key}".encode()).hexdigest()


def _created(request: Request, settings: Settings, job: Job) -> JobCreated:
    assert job.id is not None
    return JobCreated(id=job.id, url=job_url(request, settings, job.id), status=job.status)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobCreated,
    responses={
        200: {"description": "a repeated Idempotency-Key: the job the first request created"},
        422: {"description": "a bad field, or a range the index cannot serve"},
    },
)
def submit_job(
    body: JobCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    caller: WriterDep,
    idempotency_key: IdempotencyKey = None,
) -> JobCreated:
    """Submit a bisection. Releases are listed here, so a bad range fails now with 422.
    With an `Idempotency-Key` already used by this token: 200 and the first job, whatever
    this body says (a retry whose first answer was lost)."""
    digest = idempotency_digest(caller, idempotency_key)
    first = store.job_by_idempotency(session, digest) if digest else None
    if first is not None:
        response.status_code = status.HTTP_200_OK
        return _created(request, settings, first)
    policy.check_submission(body)
    try:
        fetch = policy.fetch_policy(settings)
        job = create_job(session, body, fetch=fetch, owner=caller.name, idempotency=digest)
    except IntegrityError:
        # The same key in flight twice: the other request's insert committed first.
        session.rollback()
        first = store.job_by_idempotency(session, digest) if digest else None
        if first is None:
            raise
        response.status_code = status.HTTP_200_OK
        return _created(request, settings, first)
    advance(session, job, slots_for(session, job, within_s=settings.runner_live_s))
    return _created(request, settings, job)


@router.get("", response_model=JobPage)
def list_jobs(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReaderDep,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
    package: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JobPage:
    """Jobs, newest first, filtered by status and package (names compare as PEP 503);
    an API token sees the jobs it submitted, admin and view tokens see all."""
    owner = None if caller.sees_all else caller.name
    jobs, total = store.jobs_page(
        session, status=status_, package=package, owner=owner, limit=limit, offset=offset
    )
    items = [job_summary(job, job_url(request, settings, job.id)) for job in jobs]  # type: ignore[arg-type]
    return JobPage(items=items, total=total, limit=limit, offset=offset)


def job_summary(job: Job, url: str | None) -> JobSummary:
    """A job as the list shows it (also `bisect-cli list` on the local database)."""
    return JobSummary(
        id=job.id,  # type: ignore[arg-type]
        url=url,
        status=job.status,
        message=job.message,
        package=job.package,
        range=f"{job.good}..{job.bad}",
        find_fix=job.find_fix,
        requires_gpu=job.requires_gpu,
        created_at=job.created_at,
        finished_at=job.finished_at,
        result=job.result,
        owner=job.owner,
    )


@router.get("/{job_id}", response_model=JobPublic, responses={404: {"description": "no such job"}})
def get_job_report(job_id: int, session: SessionDep, caller: ReaderDep) -> JobPublic:
    """The job's report (as `bisect-cli run --json` prints it) with its progress."""
    return job_public(session, readable_job(session, job_id, caller))


@router.get(
    "/{job_id}/trials/{number}",
    response_model=TrialPublic,
    responses={404: {"description": "no such job, or no such trial in it"}},
)
def get_job_trial(job_id: int, number: int, session: SessionDep, caller: ReaderDep) -> TrialPublic:
    """The job's trial `number` (1, 2, ... in the order they were queued), as
    GET /trials/{trial_id} gives it; `bisect-cli logs JOB TRIAL` reads this."""
    job = readable_job(session, job_id, caller)
    assert job.id is not None
    return trial_public(session, store.trial_by_number(session, job.id, number))


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses={404: {"description": "no such job"}, 409: {"description": "already finished"}},
)
def cancel_job(job_id: int, session: SessionDep, caller: WriterDep) -> JobPublic:
    """Cancel the job: queued trials are cancelled, leased ones are refused at their next
    heartbeat (409) so their runners kill them."""
    job = readable_job(session, job_id, caller)
    if not caller.may_change(job.owner):
        raise Forbidden(f"job {job_id} was submitted by another token")
    if not cancel(session, job):
        raise Conflict(f"job {job_id} has already finished ({job.status})")
    return job_public(session, job)
