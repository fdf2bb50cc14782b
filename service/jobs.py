"""Creating jobs: list the releases, pick the range, write the job and its candidates."""

import hashlib
from collections.abc import Callable
from typing import Any

from sqlmodel import Session

from contract.errors import InvalidInput
from engine import ddmin, releases
from service import pins, stages
from service.envpolicy import EnvPair
from service.index import LOCAL, PYPI_SIMPLE, FetchPolicy, list_releases, target_tags
from service.models import Candidate, Job
from service.options import JobOptions
from service.policy import check_candidates
from service.schemas import JobCreate


def releases_for(request: JobCreate, fetch: FetchPolicy = LOCAL) -> list[releases.RangeRelease]:
    """The ordered candidates of the request's range (raises RangeError, IndexUnavailable)."""
    good, bad = request.bounds
    return releases_between(request, request.package, good, bad, fetch)


def releases_between(
    options: JobOptions, package: str, good: str, bad: str, fetch: FetchPolicy = LOCAL
) -> list[releases.RangeRelease]:
    """The releases of `package` from `good` to `bad`, listed from the job's indexes."""
    python_version, tags = target_tags(options.python)
    listed = list_releases(
        package,
        index_url=options.index_url or PYPI_SIMPLE,
        extra_index_urls=options.extra_index_urls,
        find_links=options.find_links,
        policy=fetch,
    )
    return releases.select_range(
        listed,
        good,
        bad,
        pre=options.pre,
        skip_yanked=options.skip_yanked,
        package=package,
        python_version=python_version,
        platform_tags=tags,
    )


def add_candidates(
    session: Session,
    job: Job,
    found: list[releases.RangeRelease],
    *,
    stage: str = "",
    start: int = 0,
    pins: Callable[[str], list[str]] | None = None,
) -> None:
    """One candidate per listed release, at positions from `start` (`pins`: a release's
    whole environment, for the stages that hold one)."""
    for position, release in enumerate(found, start):
        session.add(
            Candidate(
                job_id=job.id,
                position=position,
                version=release.version,
                upload_time=release.upload_time,
                yanked=release.yanked,
                yanked_reason=release.yanked_reason,
                testable=release.testable,
                untestable_reason=release.untestable_reason,
                stage=stage,
                pins=pins(release.version) if pins else [],
            )
        )


def create_job(
    session: Session,
    request: JobCreate,
    *,
    machine: dict[str, Any] | None = None,
    local: bool = False,
    fetch: FetchPolicy = LOCAL,
    owner: str | None = None,
    idempotency: str | None = None,
    max_candidates: int | None = None,
    site_url: str | None = None,
) -> Job:
    """List the range's releases and store the job with its candidates (committed).

    `local`: made by `bisect-cli run`, whose process runs it (see service/queue.py);
    `fetch`: what reading the indexes may reach (the API's is strict: service/policy.py);
    `idempotency`: the submission's digest, unique (a duplicate raises IntegrityError at the
    insert, before any candidate is written); `max_candidates`: the most releases a range
    may hold (the API's BISECT_MAX_CANDIDATES, service/policy.py; None for `bisect-cli run`);
    `site_url`: the base URL it was submitted through (its webhook's links).
    """
    given = {
        "machine": machine,
        "local": local,
        "owner": owner,
        "idempotency": idempotency,
        "site_url": site_url,
    }
    policy = request.env_policy
    if isinstance(policy, EnvPair):
        return _create_dependency_job(session, request, policy, given)
    found = releases_for(request, fetch)
    check_candidates(len(found), found[0].version, found[-1].version, max_candidates)
    job = _job(
        request,
        given,
        good=found[0].version,
        bad=found[-1].version,
        pin_state=pins.initial_state(policy),
        constraints=policy.base_pins(request.package),  # a base env's; else the resolve trial's
        pins_as_of=policy.pins_as_of(
            good=(found[0].version, found[0].upload_time),
            newest=(found[-1].version, found[-1].upload_time),
        ),
    )
    session.add(job)
    session.flush()
    add_candidates(session, job, found)
    session.commit()
    session.refresh(job)
    return job


def _job(request: JobCreate, given: dict[str, Any], **fields: Any) -> Job:
    """The job row: the request's options, what every job derives from them, `given` (where
    it was made) and the `fields` of its kind."""
    return Job.model_validate(
        request,
        update={
            "script_sha256": hashlib.sha256(request.script.encode()).hexdigest(),
            "max_runs": max(request.max_runs, request.repeats),
            "hardware_class": "gpu" if request.requires_gpu else "cpu",
            **given,
            **fields,
        },
    )


def _create_dependency_job(
    session: Session, request: JobCreate, pair: EnvPair, given: dict[str, Any]
) -> Job:
    """A --from/--to job: both environments, what changed, and the two ends as mixes."""
    good, bad = pair.pins()
    changes = ddmin.changes(good, bad)
    if not changes:
        raise InvalidInput(
            "the two environments pin the same versions: there is no change to blame",
            field="to_env",
        )
    job = _job(
        request,
        given,
        good=pair.labels[0],
        bad=pair.labels[1],
        pin_state=pins.initial_state(pair),
        dependency=stages.dependency_record(changes, good, bad),
    )
    session.add(job)
    session.flush()
    everything = frozenset(c.name for c in changes)
    stages.new_mix(session, job, frozenset(), 0)
    stages.new_mix(session, job, everything, 1)
    session.commit()
    session.refresh(job)
    return job
