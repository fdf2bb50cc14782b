"""Actions on a finished (or running) job beyond cancel: its Markdown report, and new jobs
made from it: "bisect again with more repeats" and "re-run this candidate".

Both make a new job with the old one's options (the script, requirements, indexes,
thresholds), so the old job's evidence is never rewritten:

- `again`: the same range with `repeats` runs per candidate (default one more than before)
  and verdict reuse off, so every candidate is run afresh;
- `again` with `candidate`: the range narrowed to that release and its testable neighbour
  (the one before it; for the range's first release, the one after), also without reuse:
  the bounds check then runs the candidate again against its neighbour and says whether
  the step between them leaks.

The status page's buttons call the same `again_job`.
"""

from fastapi import APIRouter, Request, status
from fastapi.responses import PlainTextResponse
from sqlmodel import Session

from contract.errors import Forbidden, InvalidInput
from service import policy, store
from service.api.routes.jobs import job_public, job_url, readable_job
from service.http.deps import Caller, ReaderDep, SessionDep, SettingsDep, WriterDep
from service.jobs import create_job
from service.markdown import markdown_report
from service.models import Job
from service.options import JobOptions
from service.scheduler import advance, slots_for
from service.schemas import AgainRequest, JobCreate, JobCreated
from service.settings import Settings

router = APIRouter(prefix="/jobs", tags=["jobs"])


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
    session: Session, settings: Settings, job: Job, caller: Caller, body: AgainRequest
) -> Job:
    """A new job from `job`'s options (see the module docstring); returns it, advanced."""
    if caller.role == "viewer":
        raise Forbidden("a view token can only read")
    options = job.model_dump(include=set(JobOptions.model_fields))
    options["repeats"] = body.repeats or min(job.repeats + 1, 20)
    options["max_runs"] = max(job.max_runs, options["repeats"])
    options["reuse_verdicts"] = False
    if job.from_env is not None:
        # The two environments are what was asked; `package` and the bounds are what the
        # search found (service/pipeline.py), not options.
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
    policy.check_submission(request)
    new = create_job(session, request, fetch=policy.fetch_policy(settings), owner=caller.name)
    advance(session, new, slots_for(session, new, within_s=settings.runner_live_s))
    return new


@router.post(
    "/{job_id}/again",
    status_code=status.HTTP_201_CREATED,
    response_model=JobCreated,
    responses={404: {"description": "no such job"}, 422: {"description": "a bad field"}},
)
def bisect_again(
    job_id: int,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    caller: WriterDep,
    body: AgainRequest | None = None,
) -> JobCreated:
    """A new job from this one's options: more repeats (`repeats`, default one more) and no
    verdict reuse; with `candidate`, only that release and its testable neighbour."""
    job = readable_job(session, job_id, caller)
    new = again_job(session, settings, job, caller, body or AgainRequest())
    assert new.id is not None
    return JobCreated(id=new.id, url=job_url(request, settings, new.id), status=new.status)


@router.get(
    "/{job_id}/report.md",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/markdown": {}}}, 404: {"description": "no such job"}},
)
def report_markdown(
    job_id: int, request: Request, session: SessionDep, settings: SettingsDep, caller: ReaderDep
) -> PlainTextResponse:
    """The job's report as Markdown, ready to paste into an upstream issue."""
    job = readable_job(session, job_id, caller)
    report = job_public(session, job).report()
    base = (settings.public_url or str(request.base_url)).rstrip("/")
    text = markdown_report(report, f"{base}/jobs/{job_id}")
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
