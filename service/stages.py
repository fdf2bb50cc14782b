"""A job's stages, in order, and what moves it from one to the next.

Most jobs have one stage: the releases of `Job.package` between the two bounds. Issue
#12 adds stages before and after it. Every finished stage leaves a record in
`Job.stages` (a `service.state.StageRecord`), so the current stage is the first
of `order(job)` without one; `service/scheduler.py` asks under the job's lock, after
every trial, and the local loop and the service walk the same path.

Stages, in the order `order` lists them:

1. "mix" (--from/--to only). ddmin over the changed packages (engine/ddmin.py). A mix
   is a candidate holding its whole environment in `Candidate.pins`, built strictly (every
   pin exactly; a mix uv cannot resolve fails to build, a skip, never blamed). When the
   minimal set is found, its first culprit with two versions and its two versions become
   the search (`Job.search`; the user's options stay as submitted). A culprit that was
   added or removed has no releases: the set is then the answer.
2. "": the releases of the package searched, `Job.target` (engine/planner.py). With
   --from/--to every release is installed with the other culprits at their new versions
   and everything else as in --from: the mix that leaked, with only this package moving.
3. "release:NAME": each further culprit of an interaction, the same way.
4. "attribute" (--attribute, when stage "" found its boundary): the last good and the
   first bad release under memray, then under tracemalloc only when memray named no site,
   each traced run stopped at enough steps or its budget (engine/attribution.py);
   `Job.attribution` is their comparison. Tracing perturbs timing, so these trials are
   never judged.
5. "commit" (--commits, when stage "" found its boundary): the commits between the two
   releases' tags (listed by a runner: runners/commits.py), each built from source,
   bisected by the planner.

The job ends with stage ""'s status; a mix stage that cannot go on ends it with its own.
"""

from typing import Any

from packaging.utils import canonicalize_name
from sqlmodel import Session, col, func, select

from engine import ddmin
from engine.verdicts import Verdict
from service.envpolicy import EnvPair
from service.models import Candidate, Job
from service.state import CULPRIT_PREFIX, Dependency, StageKind, StageRecord, StageStatus

MIX, RELEASES, ATTRIBUTE, COMMIT = (
    StageKind.MIX, StageKind.RELEASES, StageKind.ATTRIBUTE, StageKind.COMMIT
)  # fmt: skip


def order(job: Job) -> list[str]:
    """The job's stages as far as they are known now (culprits appear once found)."""
    pair = isinstance(job.env_policy, EnvPair)  # a --from/--to job mixes the two first
    stages = [MIX] if pair else []
    culprits = culprit_changes(job)
    if not pair or any(c.old and c.new for c in culprits):
        stages.append(RELEASES)
    stages += [CULPRIT_PREFIX + c.name for c in culprits[1:] if c.old and c.new]
    found = record(job, RELEASES)
    if found is not None and found.status == StageStatus.FOUND:
        if job.attribute:
            stages.append(ATTRIBUTE)
        if job.commits:
            stages.append(COMMIT)
    return stages


def record(job: Job, stage: str) -> StageRecord | None:
    return next((r for r in job.stages if r.stage == stage), None)


def current(job: Job) -> str | None:
    """The first stage without a record; None when every stage has ended."""
    mix = record(job, MIX)
    if mix is not None and mix.status != StageStatus.FOUND:
        return None  # the mix stage could not find a culprit: nothing after it can run
    return next((s for s in order(job) if record(job, s) is None), None)


def finish(job: Job, stage: str, status: StageStatus, **fields: Any) -> StageRecord:
    """Record that `stage` ended (the caller commits); `fields`: `StageRecord`'s others."""
    entry = StageRecord(stage=stage, status=status, **fields)
    job.stages = [*job.stages, entry]
    return entry


def package_of(job: Job, stage: str) -> str:
    """The package whose versions a stage's candidates move."""
    if stage.startswith(CULPRIT_PREFIX):
        return stage.removeprefix(CULPRIT_PREFIX)
    return job.target.package


def next_position(session: Session, job: Job) -> int:
    query = select(func.max(Candidate.position)).where(col(Candidate.job_id) == job.id)
    found = session.exec(query).one()
    return 0 if found is None else found + 1


# --- the mix stage -------------------------------------------------------------------


def changes_of(job: Job) -> list[ddmin.Change]:
    return list(job.dependency.changes) if job.dependency else []


def culprit_changes(job: Job) -> list[ddmin.Change]:
    return list(job.dependency.culprits or []) if job.dependency else []


def envs_of(job: Job) -> tuple[dict[str, str], dict[str, str]]:
    if job.dependency is None:
        return {}, {}
    return dict(job.dependency.good), dict(job.dependency.bad)


def pins_text(pins: dict[str, str]) -> list[str]:
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def mix_label(changes: list[ddmin.Change], applied: frozenset[str]) -> str:
    """A mix's name in tables: the good environment, the bad one, or what it applies."""
    if not applied:
        return "--from env"
    if len(applied) == len(changes):
        return "--to env"
    moved = [c for c in changes if c.name in applied]
    return "mix: " + ", ".join(f"{c.name} {c.new or 'removed'}" for c in moved)


def outcome_of(candidate: Candidate) -> ddmin.Outcome:
    """A judged mix as ddmin sees it: anything but leak or bounded is unresolved."""
    verdict = Verdict(candidate.evaluations[-1])
    if verdict.leaks:
        return ddmin.Outcome.LEAK
    return ddmin.Outcome.CLEAN if verdict.bounded else ddmin.Outcome.UNRESOLVED


def new_mix(session: Session, job: Job, applied: frozenset[str], position: int) -> Candidate:
    good, bad = envs_of(job)
    candidate = Candidate(
        job_id=job.id,  # type: ignore[arg-type]
        position=position,
        version=mix_label(changes_of(job), applied),
        stage=MIX,
        pins=pins_text(ddmin.mix(good, bad, applied)),
        applied=sorted(applied),
    )
    session.add(candidate)
    return candidate


def dependency_record(changes: list[ddmin.Change], good: dict, bad: dict) -> Dependency:
    """What `Job.dependency` starts as: both environments and what changed between them."""
    return Dependency(
        good=good, bad=bad, changes=changes, worst_case_mixes=ddmin.worst_case_tests(len(changes))
    )


def held_pins(job: Job, package: str, version: str) -> list[str]:
    """A culprit release's environment: the leaking minimal mix with `package` at `version`."""
    good, bad = envs_of(job)
    culprits = {c.name for c in culprit_changes(job)}
    pins = ddmin.mix(good, bad, frozenset(culprits))
    pins[canonicalize_name(package)] = version
    return pins_text(pins)


def ending(job: Job) -> StageRecord:
    """The record the job ends with: stage ""'s, or the mix stage's when there is none."""
    found = record(job, RELEASES) or record(job, MIX)
    assert found is not None, "a job ends after one of its stages has"
    return found


def messages(job: Job) -> list[str]:
    """Every finished stage's message, in stage order: the report's headline lines."""
    return [r.message for r in job.stages if r.message]
