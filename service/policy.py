"""What the API accepts in a job that `bisect-cli run` would: the submission policy.

A client names the job's requirements and indexes, and the API server reads indexes to
list releases, so a submission must not make the server build, read its own files, or
reach into its own network (docs/security.md):

- requirements are index requirements only: a direct reference (``pkg @ URL``, VCS, a
  local path) is refused; `bisect-cli run`, where the user runs their own code, takes them;
- ``find_links``, the index URLs and ``repo`` are http or https URLs with a host, under
  the job's outbound rule (`reach`, contract/outbound.py), checked here and again by every
  request the server makes and by the runner before git or uv starts: with tokens
  configured, only the hosts in BISECT_ALLOWED_INDEXES, or any host with public addresses
  when that is unset; with no tokens (loopback only) any host written plainly; indexes are
  read with bounded redirects and a byte cap (`fetch_policy`);
- ``python`` is a minor version CPython has had or may soon have (3.8 to 3.20);
- ``webhook_url`` only where the operator set a shared secret (every webhook is signed),
  and under the webhooks' own rule (`webhook_reach`: BISECT_WEBHOOK_HOSTS, else public
  hosts, with or without tokens), which service/webhooks.py applies again before each
  attempt: `check_webhook`.

Each refusal is an `InvalidInput` naming the field (422).

And the deployment's limits (docs/security.md), so that one tenant cannot take the service
for itself; each message names the limit, the count and the setting that sets it:

- per owner (a token's name; every tokenless job is one owner), at submission: at most
  BISECT_MAX_ACTIVE_JOBS jobs queued or running, and no new job while the owner has
  BISECT_MAX_QUEUED_TRIALS trials waiting for a runner: `LimitExceeded` (429, Retry-After);
- per job, at submission: a range of at most BISECT_MAX_CANDIDATES releases (`TooLarge`,
  413; checked in service/jobs.py once the range is listed);
- per job, while it runs: BISECT_MAX_TRIALS_PER_JOB trials, its budget; the scheduler
  stops a job that needs more (`budget_spent` is its message);
- per option: repeats, max runs and timeout have upper bounds beside their definitions
  (service/options.py), so the schema, --help and the API refuse more (422).
"""

from urllib.parse import urlsplit

from packaging.requirements import Requirement
from sqlalchemy import ColumnElement, and_, func
from sqlmodel import Session, col, select

from contract import outbound
from contract.errors import InvalidInput, LimitExceeded, TooLarge
from contract.outbound import Reach
from service.index import FetchPolicy
from service.models import Job, JobStatus, Trial, TrialStatus
from service.options import PYTHON_MINORS, PYTHON_VERSION
from service.schemas import JobCreate
from service.settings import Settings

# What a client over a concurrency limit is told to wait before asking again: a poll
# interval (a job or trial ending frees a place), not a promise.
RETRY_AFTER_S = 30
# The setting that lists the hosts a job's webhook may reach (service/settings.py).
WEBHOOK_HOSTS = "BISECT_WEBHOOK_HOSTS"


def reach(settings: Settings) -> Reach | None:
    """What an API job's URLs may reach: the hosts listed, else public ones with tokens
    configured; None (anything) for a tokenless service, which serves loopback only."""
    if settings.allowed_indexes:
        return Reach(hosts=tuple(settings.allowed_indexes))
    return Reach() if settings.auth_enabled else None


def webhook_reach(settings: Settings) -> Reach:
    """Where an API job's webhook may lead: the hosts listed in BISECT_WEBHOOK_HOSTS, else
    public ones. Tokens or none: the server sends it, so loopback is no excuse."""
    return Reach(hosts=tuple(settings.webhook_hosts) if settings.webhook_hosts else None)


def check_webhook_url(url: str, rule: Reach | None) -> outbound.Allowed:
    """`url` under `rule` (None: anything, a local job's), or `outbound.Refused` naming
    BISECT_WEBHOOK_HOSTS."""
    return outbound.check(url, rule, setting=WEBHOOK_HOSTS)


def fetch_policy(settings: Settings) -> FetchPolicy:
    return FetchPolicy(
        local_paths=False, reach=reach(settings), max_bytes=settings.index_max_bytes
    )


def _url(value: str, field: str, what: str, rule: Reach | None) -> None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidInput(f"{value!r} is not a URL: {exc}", field=field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{value!r} is not an http(s) URL with a host", field=field)
    try:
        outbound.check(value, rule)
    except outbound.Refused as exc:
        raise InvalidInput(outbound.describe(what, value, exc), field=field) from None


def check_submission(request: JobCreate, rule: Reach | None = None) -> None:
    """Refuse what the API server must not act on; `InvalidInput` names the field. `rule`:
    where the job's URLs may lead (`reach`; None: any host written plainly)."""
    for text in request.requirements:
        if Requirement(text).url is not None:
            raise InvalidInput(
                f"{text!r} is a direct reference; the API takes index requirements only "
                "(use --index-url/--extra-index-url, or `bisect-cli run` for local code)",
                field="requirements",
            )
    if request.index_url is not None:
        _url(request.index_url, "index_url", "index", rule)
    for url in request.extra_index_urls:
        _url(url, "extra_index_urls", "index", rule)
    for url in request.find_links:
        _url(url, "find_links", "find-links", rule)
    if request.repo is not None:
        # Runners clone it: a URL, never a path on a runner's disk.
        if not request.repo.startswith(("https://", "http://")):
            raise InvalidInput(
                f"{request.repo!r}: the API takes an http(s) URL of the repository "
                "(a local clone's path is for `bisect-cli run` only)",
                field="repo",
            )
        _url(request.repo, "repo", "repository", rule)
    if request.python is not None:
        match = PYTHON_VERSION.fullmatch(request.python)
        if match is None or int(match["minor"]) not in PYTHON_MINORS:
            raise InvalidInput(
                f"{request.python!r}: no CPython 3.{match['minor'] if match else '?'}; "
                f"write 3.{PYTHON_MINORS.start} to 3.{PYTHON_MINORS.stop - 1}",
                field="python",
            )


def check_webhook(request: JobCreate, settings: Settings) -> None:
    """Refuse a webhook this service would not send, before any connection is made."""
    url = request.webhook_url
    if url is None:
        return
    if settings.webhook_secret is None:
        raise InvalidInput(
            "this service sends no webhooks (its operator set no BISECT_WEBHOOK_SECRET)",
            field="webhook_url",
        )
    try:
        check_webhook_url(url, webhook_reach(settings))
    except outbound.Refused as exc:
        raise InvalidInput(outbound.describe("webhook", url, exc), field="webhook_url") from None


def _who(owner: str | None) -> str:
    return f"{owner} has" if owner else "the tokenless owner has"


def _owned(owner: str | None) -> ColumnElement[bool]:
    # Local jobs (`bisect-cli run` on a shared database) are their user's, not a tenant's.
    mine = col(Job.owner) == owner if owner else col(Job.owner).is_(None)
    return and_(mine, col(Job.local).is_(False))


def check_owner_limits(session: Session, settings: Settings, owner: str | None) -> None:
    """Refuse a new job while `owner` is at a limit of the deployment (`LimitExceeded`)."""
    unfinished = col(Job.status).in_([JobStatus.QUEUED, JobStatus.RUNNING])
    active = session.exec(select(func.count()).where(_owned(owner), unfinished)).one()
    if active >= settings.max_active_jobs:
        raise LimitExceeded(
            f"too many active jobs: {_who(owner)} {active} queued or running "
            f"(BISECT_MAX_ACTIVE_JOBS={settings.max_active_jobs})",
            retry_after_s=RETRY_AFTER_S,
        )
    waiting = select(func.count()).join_from(Trial, Job, col(Trial.job_id) == col(Job.id))
    waiting = waiting.where(_owned(owner), col(Trial.status) == TrialStatus.QUEUED)
    queued = session.exec(waiting).one()
    if queued >= settings.max_queued_trials:
        raise LimitExceeded(
            f"too many queued trials: {_who(owner)} {queued} waiting for a runner "
            f"(BISECT_MAX_QUEUED_TRIALS={settings.max_queued_trials})",
            retry_after_s=RETRY_AFTER_S,
        )


def check_candidates(count: int, good: str, bad: str, most: int | None) -> None:
    """Refuse a range of more than `most` releases (None: no limit, `bisect-cli run`)."""
    if most is not None and count > most:
        raise TooLarge(
            f"{count} releases from {good} to {bad}; a job may test at most {most} "
            f"(BISECT_MAX_CANDIDATES={most}): narrow the range",
            field="range",
        )


def budget_spent(budget: int) -> str:
    """The message of a job stopped at its trial budget (service/scheduler.py)."""
    return (
        f"stopped: the job reached its budget of {budget} trials without converging "
        f"(BISECT_MAX_TRIALS_PER_JOB={budget})"
    )
