"""Creating jobs: list the releases, pick the range, write the job and its candidates."""

import hashlib
from pathlib import Path
from typing import Any

from sqlmodel import Session

from runners.envs import EnvError, resolve_pins
from runners.wire import EnvSpec
from service import releases
from service.index import PYPI_SIMPLE, list_releases, target_tags
from service.models import Candidate, Job
from service.schemas import JobCreate


def releases_for(request: JobCreate) -> list[releases.RangeRelease]:
    """The ordered candidates of the request's range (raises RangeError, IndexUnavailable)."""
    python_version, tags = target_tags(request.python)
    listed = list_releases(
        request.package,
        index_url=request.index_url or PYPI_SIMPLE,
        extra_index_urls=request.extra_index_urls,
        find_links=request.find_links,
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


def good_bound_pins(
    request: JobCreate, good: str, cache_dir: Path | None
) -> tuple[list[str], str | None]:
    """Pins of the good bound's resolution, which every other candidate is held at."""
    if request.as_released:
        return [], None
    spec = EnvSpec(
        package=request.package,
        version=good,
        python=request.python,
        requirements=request.requirements,
        index_url=request.index_url,
        extra_index_urls=request.extra_index_urls,
        find_links=request.find_links,
        pre=request.pre,
    )
    try:
        return resolve_pins(spec, cache_dir=cache_dir), None
    except EnvError as exc:
        return [], f"no pins from the good bound (candidates resolve freely): {exc}"


def create_job(
    session: Session,
    request: JobCreate,
    *,
    machine: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    local: bool = False,
) -> Job:
    """List the range's releases and store the job with its candidates (committed).

    `local`: made by `bisect-cli run`, whose process runs it (see service/queue.py).
    """
    found = releases_for(request)
    pins, pins_note = good_bound_pins(request, found[0].version, cache_dir)
    job = Job.model_validate(
        request,
        update={
            "good": found[0].version,
            "bad": found[-1].version,
            "script_sha256": hashlib.sha256(request.script.encode()).hexdigest(),
            "constraints": pins,
            "max_runs": max(request.max_runs, request.repeats),
            "hardware_class": "gpu" if request.requires_gpu else "cpu",
            "machine": machine,
            "message": pins_note,
            "local": local,
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
