"""Verdict reuse: a release already judged under the same conditions is not run again.

Two candidates share a `reuse_key` when everything that decides their verdict is
the same (see `reuse_key`). When the planner picks a candidate that has not been
evaluated yet, and a candidate of an *earlier* job with the same key holds
decisive evaluations (leak, clean, plateau), those evaluations are copied
(verdict, growth, freeze, resolution) and the candidate points at its source
with `reused_from`. Errors, skips and inconclusive verdicts are never reused:
they may say more about the machine or the index that day than about the
release. A job with `reuse_verdicts=False` neither reuses nor is skipped over:
its own candidates still get keys, so later jobs can reuse its verdicts.

Portable SQL only (an indexed equality and a comparison), so SQLite and
Postgres behave the same.
"""

import hashlib
import json
from dataclasses import asdict
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from sqlmodel import Session, col, select

from service.analysis import ClassifierSettings
from service.models import Candidate, Job
from service.specs import env_spec
from service.verdicts import Verdict

# Bump when the key's contents change, so old keys stop matching new ones.
KEY_VERSION = 1
REUSABLE = frozenset({Verdict.LEAK.value, Verdict.CLEAN.value, Verdict.PLATEAU.value})


def _version(text: str) -> str:
    try:
        return str(Version(text))
    except InvalidVersion:
        return text


def _other_pins(constraints: list[str], package: str) -> list[str]:
    """The held pins without the package's own (the environment builder drops it too)."""
    own = canonicalize_name(package)
    kept = []
    for text in constraints:
        try:
            if canonicalize_name(Requirement(text).name) == own:
                continue
        except InvalidRequirement:
            pass
        kept.append(text.strip())
    return sorted(kept)


def key_material(job: Job, candidate: Candidate) -> dict[str, Any]:
    """Everything that decides a candidate's verdict, as canonical JSON-ready data.

    - the script (its sha256), the package (canonical name) and the version;
    - the environment spec as the runner gets it: Python, extra requirements
      (sorted), index URL, extra index URLs and find-links (in order: order
      decides which index wins), pre-releases, the pins of the other packages
      (sorted, the package's own pin dropped), for as-released jobs the
      upload-time cutoff, and for base-environment jobs that mark (every pin is
      then installed, not only what the candidate needs);
    - the run policy that changes what a run can show: timeout, memory cap,
      sample rate, repeats;
    - the classifier settings, with defaults filled in (an empty policy and an
      explicit default policy are the same);
    - the hardware class (a GPU leak needs a GPU to show) and requires_gpu.
    """
    spec = env_spec(job, candidate)
    return {
        "v": KEY_VERSION,
        "script_sha256": job.script_sha256,
        "package": canonicalize_name(job.package),
        "version": _version(candidate.version),
        "env": {
            "python": spec.python,
            "requirements": sorted(r.strip() for r in spec.requirements),
            "index_url": spec.index_url,
            "extra_index_urls": list(spec.extra_index_urls),
            "find_links": list(spec.find_links),
            "pre": spec.pre,
            "as_released": job.as_released,
            "constraints": _other_pins(spec.constraints, job.package),
            "exclude_newer": spec.exclude_newer.isoformat() if spec.exclude_newer else None,
            # Only when set, so the keys of jobs without one stay what they were.
            **({"base_env": True} if spec.base_env else {}),
        },
        "run": {
            "timeout_s": float(job.timeout_s),
            "memory_limit_bytes": job.memory_limit,
            "sample_hz": float(job.sample_hz),
            "repeats": job.repeats,
        },
        "classifier": asdict(ClassifierSettings(**job.classifier)),
        "hardware_class": job.hardware_class,
        "requires_gpu": job.requires_gpu,
    }


def reuse_key(job: Job, candidate: Candidate) -> str:
    blob = json.dumps(key_material(job, candidate), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def ensure_keys(session: Session, job: Job, candidates: list[Candidate]) -> None:
    """Give every candidate of `job` its key (computed once, lazily; caller commits)."""
    for candidate in candidates:
        if candidate.reuse_key is None:
            candidate.reuse_key = reuse_key(job, candidate)
            session.add(candidate)


def find_source(session: Session, job: Job, candidate: Candidate) -> Candidate | None:
    """The best earlier judged candidate with the same key: most evaluations, then newest."""
    if candidate.reuse_key is None:
        return None
    query = select(Candidate).where(
        col(Candidate.reuse_key) == candidate.reuse_key,
        col(Candidate.job_id) < job.id,
        col(Candidate.verdict).in_(sorted(REUSABLE)),
    )
    found = [c for c in session.exec(query) if c.evaluations]
    if not found:
        return None
    return max(found, key=lambda c: (len(c.evaluations), c.id or 0))


def try_reuse(session: Session, job: Job, candidate: Candidate) -> bool:
    """Copy an earlier judgement into a not yet evaluated candidate; True when done."""
    if not job.reuse_verdicts or candidate.evaluations or candidate.reused_from is not None:
        return False
    source = find_source(session, job, candidate)
    if source is None:
        return False
    candidate.evaluations = list(source.evaluations)
    candidate.verdict = source.verdict
    candidate.growth_mib = source.growth_mib
    candidate.freeze = list(source.freeze)
    candidate.resolution = source.resolution
    candidate.resolution_note = source.resolution_note
    candidate.env_seconds = source.env_seconds
    candidate.reused_from = source.id
    session.add(candidate)
    return True


def find_attribution(session: Session, job: Job, good: Candidate, bad: Candidate) -> Job | None:
    """The newest earlier job that traced the same boundary pair under the same conditions
    (both candidates' keys), so its attribution is copied rather than traced again."""
    if not job.reuse_verdicts or good.reuse_key is None or bad.reuse_key is None:
        return None

    def jobs_with(key: str) -> set[int]:
        query = select(Candidate.job_id).where(
            col(Candidate.reuse_key) == key, col(Candidate.job_id) < job.id
        )
        return set(session.exec(query))

    for job_id in sorted(jobs_with(good.reuse_key) & jobs_with(bad.reuse_key), reverse=True):
        other = session.get(Job, job_id)
        found = other.attribution if other is not None else None
        if found and (found.get("last_good"), found.get("first_bad")) == (
            good.version, bad.version
        ):  # fmt: skip
            return other
    return None


def note(session: Session, candidates: list[Candidate]) -> str | None:
    """One line per source job: "verdicts of 1.0.5, 1.0.6 reused from job 3"."""
    reused = [c for c in candidates if c.reused_from is not None]
    if not reused:
        return None
    ids = sorted({c.reused_from for c in reused if c.reused_from is not None})
    query = select(Candidate.id, Candidate.job_id).where(col(Candidate.id).in_(ids))
    source_job = dict(session.exec(query).all())
    by_job: dict[int, list[str]] = {}
    for c in reused:
        by_job.setdefault(source_job.get(c.reused_from, 0), []).append(c.version)
    lines = [
        f"verdict{'s' if len(versions) > 1 else ''} of {', '.join(versions)} "
        f"reused from job {job_id}"
        for job_id, versions in sorted(by_job.items())
    ]
    return "; ".join(lines)
