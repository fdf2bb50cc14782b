"""Jobs (API tokens): submit, list, report, a trial by number, cancel, bisect again, the
Markdown report and the webhooks' log. One router for the resource; each route parses the
request, calls the service (service/views.py reads, service/actions.py changes) and returns
its model.

`POST /jobs` takes an `Idempotency-Key`: a repeat of a key by the same token returns the
first job (200), whatever the body says this time.
"""

import hashlib
import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from pydantic import PlainValidator, ValidationError

from contract.errors import InvalidInput
from contract.wire import API_PREFIX, IDEMPOTENCY_HEADER
from service import actions, store, views
from service.access import Caller
from service.http.deps import Offset, ReaderDep, SessionDep, SettingsDep, WriterDep, site_url
from service.models import Job, JobStatus
from service.schemas import (
    AgainRequest,
    JobCreate,
    JobCreated,
    JobPage,
    JobPublic,
    TrialPublic,
    WebhookDeliveryPublic,
)
from service.settings import Settings

router = APIRouter(prefix="/jobs", tags=["jobs"])


def job_url(request: Request, settings: Settings, job_id: int) -> str:
    return f"{site_url(request, settings)}{API_PREFIX}/jobs/{job_id}"


def page_url(request: Request, settings: Settings, job_id: int) -> str:
    """The job's status page (service/web/routes.py `/jobs/{id}`), on the same site."""
    return f"{site_url(request, settings)}/jobs/{job_id}"


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


# FastAPI validates a declared body on the event loop, before the route runs, and a job's
# checks read up to three environment files (engine/baseenv.py: linear, but up to a few
# tenths of a second of CPU): every other request, runner heartbeats included, would wait.
# So the body is declared as `JobCreate` (the OpenAPI schema says so) but passed on as sent
# (a dict, or whatever JSON came) and validated by `_checked`, in the worker thread this
# sync route runs in.
UncheckedJob = Annotated[
    JobCreate, PlainValidator(lambda sent: sent, json_schema_input_type=JobCreate)
]


def _checked(body: Any) -> JobCreate:
    """`body` validated as `JobCreate`; its errors answered as FastAPI's would be (422)."""
    try:
        return JobCreate.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


def _created(request: Request, settings: Settings, job: Job) -> JobCreated:
    assert job.id is not None
    return JobCreated(
        id=job.id,
        url=job_url(request, settings, job.id),
        page_url=page_url(request, settings, job.id),
        status=job.status,
    )


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
    body: UncheckedJob,
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
    site = site_url(request, settings)
    job, created = actions.submit_job(
        session, settings, _checked(body), caller.name, digest, site=site
    )
    if not created:
        response.status_code = status.HTTP_200_OK
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
    offset: Offset = 0,
) -> JobPage:
    """Jobs, newest first, filtered by status and package (names compare as PEP 503);
    an API token sees the jobs it submitted, admin and view tokens see all."""
    owner = None if caller.sees_all else caller.name
    jobs, total = store.jobs_page(
        session, status=status_, package=package, owner=owner, limit=limit, offset=offset
    )
    items = [views.job_summary(job, job_url(request, settings, job.id)) for job in jobs]  # type: ignore[arg-type]
    return JobPage(items=items, total=total, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobPublic, responses={404: {"description": "no such job"}})
def get_job_report(job_id: int, session: SessionDep, caller: ReaderDep) -> JobPublic:
    """The job's report (as `bisect-cli run --json` prints it) with its progress."""
    return views.job_public(session, views.readable_job(session, job_id, caller))


@router.get(
    "/{job_id}/trials/{number}",
    response_model=TrialPublic,
    responses={404: {"description": "no such job, or no such trial in it"}},
)
def get_job_trial(job_id: int, number: int, session: SessionDep, caller: ReaderDep) -> TrialPublic:
    """The job's trial `number` (1, 2, ... in the order they were queued), as
    GET /trials/{trial_id} gives it; `bisect-cli logs JOB TRIAL` reads this."""
    job = views.readable_job(session, job_id, caller)
    assert job.id is not None
    return views.trial_public(session, store.trial_by_number(session, job.id, number))


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses={404: {"description": "no such job"}, 409: {"description": "already finished"}},
)
def cancel_job(
    job_id: int, session: SessionDep, settings: SettingsDep, caller: WriterDep
) -> JobPublic:
    """Cancel the job: queued trials are cancelled, leased ones are refused at their next
    heartbeat (409) so their runners kill them."""
    return views.job_public(session, actions.cancel_job(session, settings, job_id, caller))


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
    verdict reuse; with `candidate`, only that release and its testable neighbour
    (service/actions.py)."""
    site = site_url(request, settings)
    new = actions.again_job(session, settings, job_id, caller, body or AgainRequest(), site)
    return _created(request, settings, new)


@router.get(
    "/{job_id}/webhooks",
    response_model=list[WebhookDeliveryPublic],
    responses={404: {"description": "no such job"}},
)
def get_job_webhooks(
    job_id: int, session: SessionDep, caller: ReaderDep
) -> list[WebhookDeliveryPublic]:
    """The webhooks the job's end sends (its --webhook URL; the operator's, its URL unshown)
    and each attempt: time, result, the next attempt. Empty while the job runs."""
    return views.job_webhooks(session, views.readable_job(session, job_id, caller))


@router.get(
    "/{job_id}/report.md",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/markdown": {}}}, 404: {"description": "no such job"}},
)
def report_markdown(
    job_id: int, request: Request, session: SessionDep, settings: SettingsDep, caller: ReaderDep
) -> PlainTextResponse:
    """The job's report as Markdown, ready to paste into an upstream issue."""
    job = views.readable_job(session, job_id, caller)
    text = views.job_markdown(session, job, f"{site_url(request, settings)}/jobs/{job_id}")
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
