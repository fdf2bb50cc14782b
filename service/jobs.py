"""Creating jobs: list the releases, pick the range, write the job and its candidates."""

import hashlib
from typing import Any

from sqlmodel import Session

from service import baseenv, pins, releases
from service.index import LOCAL, PYPI_SIMPLE, FetchPolicy, list_releases, target_tags
from service.models import Candidate, Job
from service.resolution import pins_as_of
from service.schemas import JobCreate


def releases_for(request: JobCreate, fetch: FetchPolicy = LOCAL) -> list[releases.RangeRelease]:
    """The ordered candidates of the request's range (raises RangeError, IndexUnavailable)."""
    python_version, tags = target_tags(request.python)
    listed = list_releases(
        request.package,
        index_url=request.index_url or PYPI_SIMPLE,
        extra_index_urls=request.extra_index_urls,
        find_links=request.find_links,
        policy=fetch,
    )
    good, bad = request.bounds
    return releases.select_range(
        listed,
        good,
        bad,
        pre=request.pre,
        skip_yanked=request.skip_yanked,
        package=request.package,
        python_version=python_version,
        platform_tags=tags,
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
) -> Job:
    """List the range's releases and store the job with its candidates (committed).

    `local`: made by `bisect-cli run`, whose process runs it (see service/queue.py);
    `fetch`: what reading the indexes may reach (the API's is strict: service/api/policy.py);
    `idempotency`: the submission's digest, unique (a duplicate raises IntegrityError at the
    insert, before any candidate is written).
    """
    found = releases_for(request, fetch)
    held: dict[str, Any] = {}
    if request.base_env is not None:
        base = baseenv.parse(request.base_env, request.base_env_name)
        held = {"constraints": base.split(request.package)[0], "pins_as_of": None}
    job = Job.model_validate(
        request,
        update={
            "good": found[0].version,
            "bad": found[-1].version,
            "script_sha256": hashlib.sha256(request.script.encode()).hexdigest(),
            "pin_state": pins.initial_state(request.as_released, request.base_env is not None),
            "pins_as_of": pins_as_of(
                as_released=request.as_released,
                resolve_at=request.resolve_at,
                good=(found[0].version, found[0].upload_time),
                newest=(found[-1].version, found[-1].upload_time),
            ),
            "max_runs": max(request.max_runs, request.repeats),
            "hardware_class": "gpu" if request.requires_gpu else "cpu",
            "machine": machine,
            "local": local,
            "owner": owner,
            "idempotency": idempotency,
            **held,
        },
    )
    session.add(job)
    session.flush()
    for position, release in enumerate(found):
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
            )
        )
    session.commit()
    session.refresh(job)
    return job
