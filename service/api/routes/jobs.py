"""Jobs: submit, list, show, cancel (API tokens)."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from sqlalchemy import func
from sqlmodel import Session, col, select

from service.api.deps import ClientAuth, SessionDep, SettingsDep
from service.api.schemas import JobCreated, JobPage, JobPublic, JobSummary
from service.index import IndexUnavailable
from service.jobs import JobRejected, create_job
from service.models import Job, JobStatus, TrialStatus
from service.releases import RangeError
from service.report import build_report
from service.scheduler import advance, cancel, candidates_of, slots_for, trials_of
from service.schemas import JobCreate
from service.settings import Settings

router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[ClientAuth])


def job_url(request: Request, settings: Settings, job_id: int) -> str:
    base = (settings.public_url or str(request.base_url)).rstrip("/")
    return f"{base}/api/v1/jobs/{job_id}"


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id} not found")
    return job


def job_public(session: Session, job: Job) -> dict[str, Any]:
    candidates = candidates_of(session, job)
    trials = trials_of(session, job)
    report = build_report(job, candidates, trials)
    count = {s: sum(1 for t in trials if t.status == s) for s in TrialStatus}
    report["progress"] = {
        "candidates": len(candidates),
        "judged": sum(1 for c in candidates if c.verdict is not None),
        "trials_done": count[TrialStatus.DONE],
        "trials_running": count[TrialStatus.LEASED],
        "trials_queued": count[TrialStatus.QUEUED],
        "running": [
            {
                "trial": t.id,
                "version": next(c.version for c in candidates if c.id == t.candidate_id),
                "runner": t.runner_id,
                "attempt": t.attempt,
                "rss": t.rss,
            }
            for t in trials
            if t.status == TrialStatus.LEASED
        ],
    }
    report["created_at"] = job.created_at
    report["finished_at"] = job.finished_at
    return report


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobCreated,
    responses={422: {"description": "a bad field, or a range the index cannot serve"}},
)
def submit_job(
    body: JobCreate, request: Request, session: SessionDep, settings: SettingsDep
) -> JobCreated:
    """Submit a bisection. Releases are listed here, so a bad range fails now with 422."""
    try:
        job = create_job(session, body, cache_dir=settings.uv_cache_dir)
    except RangeError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=f"range: {exc}") from None
    except IndexUnavailable as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, detail=f"index_url: {exc}"
        ) from None
    except JobRejected as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from None
    advance(session, job, slots_for(session, job, within_s=settings.runner_live_s))
    assert job.id is not None
    return JobCreated(id=job.id, url=job_url(request, settings, job.id), status=job.status)


@router.get("", response_model=JobPage)
def list_jobs(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
    package: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JobPage:
    """Jobs, newest first, filtered by status and package (names compare as PEP 503)."""
    where = []
    if status_ is not None:
        where.append(col(Job.status) == status_.value)
    if package:
        where.append(_canonical(col(Job.package)) == _canonical_text(package))
    total = session.exec(select(func.count()).select_from(Job).where(*where)).one()
    query = select(Job).where(*where).order_by(col(Job.id).desc()).offset(offset).limit(limit)
    items = [
        JobSummary(
            id=job.id,  # type: ignore[arg-type]
            url=job_url(request, settings, job.id),  # type: ignore[arg-type]
            status=job.status,
            message=job.message,
            package=job.package,
            range=f"{job.good}..{job.bad}",
            find_fix=job.find_fix,
            requires_gpu=job.requires_gpu,
            created_at=job.created_at,
            finished_at=job.finished_at,
            result=job.result,
        )
        for job in session.exec(query)
    ]
    return JobPage(items=items, total=total, limit=limit, offset=offset)


def _canonical(column: Any) -> Any:
    # PEP 503 in portable SQL: lower case, with '_' and '.' read as '-'.
    return func.lower(func.replace(func.replace(column, "_", "-"), ".", "-"))


def _canonical_text(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@router.get("/{job_id}", response_model=JobPublic, responses={404: {"description": "no such job"}})
def get_job_report(job_id: int, session: SessionDep) -> dict[str, Any]:
    """The job's report (as `bisect-cli run --json` prints it) with its progress."""
    return job_public(session, get_job(session, job_id))


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses={404: {"description": "no such job"}, 409: {"description": "already finished"}},
)
def cancel_job(job_id: int, session: SessionDep) -> dict[str, Any]:
    """Cancel the job: queued trials are cancelled, leased ones are refused at their next
    heartbeat (409) so their runners kill them."""
    job = get_job(session, job_id)
    if not cancel(session, job):
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"job {job_id} has already finished ({job.status})"
        )
    return job_public(session, job)
