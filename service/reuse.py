"""Verdict reuse: a release already judged under the same conditions is not run again,
and only where the earlier verdict is as strong as a fresh one would be.

Rules, in code order:

1. Key (`key_material`, `reuse_key`). Two candidates share a key when everything that
   decides their verdict is the same: every job option that can change a verdict, read
   from its definition (`VERDICT_OPTIONS`: each option of service/options.py not declared
   `verdict=False`, so a new option is keyed unless it says it cannot change a verdict),
   the version, the environment the runner gets for it and the hardware class. The
   options hold the script (its text and its file name: a script named like a module it
   imports shadows it), the `--env` variables (PYTHONPATH can put a fake module first),
   the indexes and environment policy, the run policy and the classifier thresholds.
   `KEY_VERSION` is bumped whenever the key's contents change, so keys made by older code
   (which could hold verdicts that later rules refuse) never match a new one. Repeats and
   early stopping are not in the key: they decide how strong a verdict is, which rule 3
   checks.
2. Keys are computed once per candidate, lazily (`ensure_keys`), for every job, also
   one with `reuse_verdicts=False`: its own verdicts can serve later jobs.
3. Source (`find_source`): a candidate of an *earlier* job with the same key, and
   - the same owner (`Job.owner`; None is `bisect-cli run` or an open service), or an
     owner of the same trust group (`BISECT_REUSE_GROUPS`, `owners`): one tenant's
     verdicts never decide another's unless an admin grouped them;
   - its job ran at least as many repeats per evaluation as this one asks;
   - judged by its own trials (not itself a reuse), every evaluation decisive (leak,
     clean, plateau) and agreeing (clean and plateau agree), and never contradicted by
     another job (rule 6). Stricter than the planner, which judges a candidate by its
     decisive evaluations and lets an inconclusive one beside them pass: a verdict that a
     re-run of its own could not reproduce is weaker than a fresh one, so it is not lent;
   - each of its deciding runs either ran to its end, or was stopped by the memory-cap
     rule (`CAP_NEAR`: it only stops a run the cap would kill, and an OOM kill with a
     rising floor is a leak in a fresh run too), or was stopped early on a horizon of at
     least `contract.earlystop.MIN_HORIZON_S` (the trial's analysis["early_stop"]), the
     bound below which the rule itself never takes a leak look. A run stopped early
     without that record (every run of the code before it) is too weak: on a short
     horizon the rule fired on import ramps.
   Among those: the most evaluations, then the newest.
4. Copy (`try_reuse`): the source's verdict as *one* evaluation, with its growth, freeze
   and resolution, and `reused_from` pointing at it. The planner confirms the boundary
   pair by running each until it has two evaluations (engine/planner.py rule 4), so the
   job always runs its own boundary pair, and a stale verdict there is caught.
5. Bounds (`stale_bounds`): a bound in the wrong state on a reused verdict alone would
   end the job without a run of its own; it is run first, and the job ends only if its
   own evaluation agrees. One of its own that decides nothing (inconclusive, skip, error:
   engine/planner.py) leaves the reused verdict alone again, so it runs again, up to the
   planner's `MAX_EVALUATIONS` in all; after that the planner calls it unconfirmed.
6. Contradictions (`mark_contradictions`): when a candidate's own decisive evaluations
   say leak and an earlier job's candidate of the same key and owners (rule 3) says
   bounded (or the reverse; an inconclusive, skipped or erroring evaluation beside them
   contradicts nothing, as in the planner), the
   earlier one records this job (`contradicted_by_job`): it is shown as flaky and never
   reused again. A reused candidate whose own run contradicts the verdict it copied
   records the source's job the same way; its evaluations disagree, so the planner calls
   it flaky and steps around it. Either way both jobs' views say "flaky: contradicted by
   job N" for the owner's own job, "... by a job of this trust group" for another owner's
   (service/report.py `links` decides, `contradiction_note` words it). Jobs with
   `reuse_verdicts=False` (`--no-reuse`, "Bisect again") mark too.
7. Attribution (`find_attribution`): an earlier job of the same owner (not the trust
   group: the attribution names the job it came from) that traced the same boundary pair
   under the same keys lends its attribution.
8. Note (`note`): one line per source job for the job's message, naming the job only when
   it is the same owner's; a verdict from another owner of the trust group is "reused from
   an earlier job of this trust group" (an owner sees only their own jobs).

Errors, skips and inconclusive verdicts are never reused: they may say more about the
machine or the index that day than about the release. Portable SQL only (indexed
equality, IN, comparisons and a join), so SQLite and Postgres behave the same.
"""

import hashlib
import json
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, get_args

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from sqlalchemy import and_, or_
from sqlmodel import Session, col, select

from contract.earlystop import MIN_HORIZON_S
from engine.analysis import ClassifierSettings
from engine.planner import MAX_EVALUATIONS
from engine.verdicts import Verdict
from service import kinds
from service.envpolicy import AsReleased
from service.models import Candidate, Job, Trial, TrialStatus
from service.options import JobOptions, changes_verdict
from service.settings import get_settings
from service.specs import env_spec

# Bump when the key's contents change, so old keys stop matching new ones.
# 2: the job's --env variables and the script's file name; repeats left for rule 3.
# 3: every option that can change a verdict, read from its definition (VERDICT_OPTIONS).
KEY_VERSION = 3
# The job options in the key: all but those declared unable to change a verdict.
VERDICT_OPTIONS = tuple(
    name for name, info in JobOptions.model_fields.items() if changes_verdict(info)
)
CLASSIFIER = frozenset(f.name for f in fields(ClassifierSettings))
# Options typed float (or float | None): an int given for one means the same float.
_FLOATS = {
    name: float in (info.annotation, *get_args(info.annotation))
    for name, info in JobOptions.model_fields.items()
}
REUSABLE = frozenset({Verdict.LEAK.value, Verdict.CLEAN.value, Verdict.PLATEAU.value})
BOUNDED = sorted({Verdict.CLEAN.value, Verdict.PLATEAU.value})
# Where a note says a verdict came from when another owner of the trust group judged it.
GROUP_SOURCE = "an earlier job of this trust group"
# How contract/earlystop.py words a stop by the memory-cap rule (`EarlyStopper.look`).
CAP_NEAR = "the memory cap is near"


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


def _canonical(name: str, value: Any) -> Any:
    """An option's value as the key holds it: one form per meaning."""
    if name == "package":
        return canonicalize_name(value) if value else value
    if name == "requirements":
        return sorted(r.strip() for r in value)
    if name == "variables":
        return dict(sorted(value.items()))
    if name in CLASSIFIER:  # unset and the default are the same threshold
        return getattr(ClassifierSettings(), name) if value is None else float(value)
    if isinstance(value, int) and not isinstance(value, bool) and _FLOATS.get(name):
        return float(value)  # 600 and 600.0 are one timeout
    if isinstance(value, str) and len(value) > 200:  # the script, a base environment
        return "sha256:" + hashlib.sha256(value.encode()).hexdigest()
    return value


def key_material(job: Job, candidate: Candidate) -> dict[str, Any]:
    """Everything that decides a candidate's verdict, as canonical JSON-ready data.

    - every option of `VERDICT_OPTIONS` as the job holds it (`_canonical`: the package's
      canonical name, requirements sorted, variables by name, classifier thresholds
      with their defaults filled in, long texts as their sha256);
    - the version, and the script's digest as stored with the job;
    - the environment spec as the runner gets it: the options above made concrete for
      this candidate, and what the job resolved: the pins of the other packages
      (sorted, the package's own pin dropped), for as-released jobs the upload-time
      cutoff, and for base-environment jobs that mark (every pin is then installed,
      not only what the candidate needs);
    - the hardware class (a GPU leak needs a GPU to show).
    """
    spec = env_spec(job, candidate)
    return {
        "v": KEY_VERSION,
        "options": {name: _canonical(name, getattr(job, name)) for name in VERDICT_OPTIONS},
        # The digest stored at submission too (the option's text is hashed above).
        "script_sha256": job.script_sha256,
        "version": _version(candidate.version),
        "env": {
            "python": spec.python,
            "requirements": sorted(r.strip() for r in spec.requirements),
            "index_url": spec.index_url,
            "extra_index_urls": list(spec.extra_index_urls),
            "find_links": list(spec.find_links),
            "pre": spec.pre,
            "as_released": isinstance(job.env_policy, AsReleased),
            "constraints": _other_pins(spec.constraints, job.target.package),
            "exclude_newer": spec.exclude_newer.isoformat() if spec.exclude_newer else None,
            # Only when set, as before (tests/test_baseenv.py reads the mark's absence).
            **({"base_env": True} if spec.base_env else {}),
        },
        "hardware_class": job.hardware_class,
    }


def reuse_key(job: Job, candidate: Candidate) -> str:
    material = key_material(job, candidate)
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def ensure_keys(session: Session, job: Job, candidates: list[Candidate]) -> None:
    """Give every candidate of `job` its key (computed once, lazily; caller commits)."""
    for candidate in candidates:
        if candidate.reuse_key is None:
            candidate.reuse_key = reuse_key(job, candidate)
            session.add(candidate)


def owners(owner: str | None) -> frozenset[str | None]:
    """Whose verdicts `owner`'s jobs may reuse: the owner, or every owner of its trust
    group (`BISECT_REUSE_GROUPS`, read only for an owned job)."""
    if owner is None:
        return frozenset({None})
    groups = get_settings().reuse_groups
    return next((frozenset(g) for g in groups if owner in g), frozenset({owner}))


def _same_owner(job: Job) -> Any:
    """Rule 7's owner condition on the joined `Job` row (None matches only None)."""
    return col(Job.owner).is_(None) if job.owner is None else col(Job.owner) == job.owner


def _owners(job: Job) -> Any:
    """Rule 3's owner condition on the joined `Job` row: the job's owner or trust group."""
    if job.owner is None:
        return col(Job.owner).is_(None)
    return col(Job.owner).in_(sorted(o for o in owners(job.owner) if o is not None))


def verdict_class(verdicts: Sequence[str]) -> str | None:
    """The class, "leak" or "bounded", when every verdict is decisive and they agree, else None."""
    classes = {
        "leak" if Verdict(v).leaks else "bounded" if Verdict(v).bounded else None
        for v in verdicts
    }
    return next(iter(classes)) if len(classes) == 1 else None


def strong_run(trial: Trial) -> bool:
    """Rule 3: the run went to its end, was stopped by the cap rule, or was stopped early
    on a horizon of at least MIN_HORIZON_S."""
    analysis = trial.analysis or {}
    stopped = analysis.get("stopped_early")
    if not stopped or str(stopped).startswith(CAP_NEAR):
        return True
    record = analysis.get("early_stop") or {}
    horizon = record.get("horizon_s") if isinstance(record, dict) else None
    return isinstance(horizon, int | float) and horizon >= MIN_HORIZON_S


def _strong(session: Session, found: list[Candidate]) -> list[Candidate]:
    """The candidates of `found` whose every deciding run is strong (one query)."""
    ids = [c.id for c in found]
    query = select(Trial).where(
        col(Trial.candidate_id).in_(ids),
        kinds.JUDGED,
        col(Trial.status) == TrialStatus.DONE.value,
    )
    weak: set[int] = set()
    closed = {c.id: len(c.evaluations) for c in found}
    for trial in session.exec(query):
        if trial.evaluation <= closed[trial.candidate_id] and not strong_run(trial):
            weak.add(trial.candidate_id)
    return [c for c in found if c.id not in weak]


def find_source(session: Session, job: Job, candidate: Candidate) -> Candidate | None:
    """The best earlier candidate whose verdict is as strong as a fresh one (rule 3)."""
    if candidate.reuse_key is None:
        return None
    query = (
        select(Candidate)
        .join(Job, col(Job.id) == col(Candidate.job_id))
        .where(
            col(Candidate.reuse_key) == candidate.reuse_key,
            col(Candidate.job_id) < job.id,
            col(Candidate.verdict).in_(sorted(REUSABLE)),
            col(Candidate.reused_from).is_(None),
            col(Candidate.contradicted_by_job).is_(None),
            col(Job.repeats) >= job.repeats,
            _owners(job),
        )
    )
    found = [c for c in session.exec(query) if verdict_class(c.evaluations) is not None]
    if not found:
        return None
    strong = _strong(session, found)
    return max(strong, key=lambda c: (len(c.evaluations), c.id or 0)) if strong else None


def try_reuse(session: Session, job: Job, candidate: Candidate) -> bool:
    """Copy an earlier judgement into a not yet evaluated candidate; True when done."""
    if not job.reuse_verdicts or candidate.evaluations or candidate.reused_from is not None:
        return False
    source = find_source(session, job, candidate)
    if source is None:
        return False
    # One evaluation, however many the source had: the boundary pair still runs (rule 4).
    candidate.evaluations = [source.verdict]  # type: ignore[list-item]
    candidate.verdict = source.verdict
    candidate.growth_mib = source.growth_mib
    candidate.freeze = list(source.freeze)
    candidate.resolution = source.resolution
    candidate.resolution_note = source.resolution_note
    candidate.env_seconds = source.env_seconds
    candidate.reused_from = source.id
    session.add(candidate)
    return True


def stale_bounds(candidates: list[Candidate], find_fix: bool) -> list[int]:
    """Rule 5: the bounds (0, last) in the wrong state on a reused verdict alone, with
    evaluations left before the planner's bound."""
    wrong = {0: "leak", len(candidates) - 1: "bounded"}
    if find_fix:
        wrong = {0: "bounded", len(candidates) - 1: "leak"}
    return [
        index
        for index, state in wrong.items()
        if candidates[index].reused_from is not None
        and len(candidates[index].evaluations) < MAX_EVALUATIONS
        and _own_class(candidates[index]) is None
        and verdict_class(candidates[index].evaluations[:1]) == state
    ]


def _own_class(candidate: Candidate) -> str | None:
    """The class of the candidate's own decisive evaluations (a reused first one left out;
    undecided ones contradict nothing), None when it has none or they disagree."""
    own = candidate.evaluations[1:] if candidate.reused_from else candidate.evaluations
    decisive = [v for v in own if Verdict(v).decisive]
    return verdict_class(decisive) if decisive else None


def mark_contradictions(session: Session, job: Job, candidates: list[Candidate]) -> None:
    """Rule 6 for the judged candidates of `job` (one query; caller commits)."""
    own = {c.reuse_key: cls for c in candidates if c.reuse_key and (cls := _own_class(c))}
    if not own:
        return
    leaking = [k for k, cls in own.items() if cls == "leak"]
    bounded = [k for k, cls in own.items() if cls == "bounded"]
    query = (
        select(Candidate)
        .join(Job, col(Job.id) == col(Candidate.job_id))
        .where(
            col(Candidate.job_id) < job.id,
            col(Candidate.contradicted_by_job).is_(None),
            col(Candidate.reused_from).is_(None),
            or_(
                and_(col(Candidate.reuse_key).in_(leaking), col(Candidate.verdict).in_(BOUNDED)),
                and_(col(Candidate.reuse_key).in_(bounded), col(Candidate.verdict) == "leak"),
            ),
            _owners(job),
        )
    )
    for earlier in session.exec(query):
        earlier.contradicted_by_job = job.id
        session.add(earlier)
    for candidate in candidates:
        if candidate.reused_from is None or candidate.contradicted_by_job:
            continue
        mine, copied = _own_class(candidate), verdict_class(candidate.evaluations[:1])
        if mine is None or mine == copied:
            continue
        source = session.get(Candidate, candidate.reused_from)
        if source is not None:
            candidate.contradicted_by_job = source.job_id
            session.add(candidate)


def find_attribution(session: Session, job: Job, good: Candidate, bad: Candidate) -> Job | None:
    """The newest earlier job of the same owner that traced the same boundary pair under the
    same conditions (both candidates' keys), so its attribution is copied rather than
    traced again (rule 7)."""
    if not job.reuse_verdicts or good.reuse_key is None or bad.reuse_key is None:
        return None

    def jobs_with(key: str) -> set[int]:
        query = (
            select(Candidate.job_id)
            .join(Job, col(Job.id) == col(Candidate.job_id))
            .where(col(Candidate.reuse_key) == key, col(Candidate.job_id) < job.id)
            .where(_same_owner(job))
        )
        return set(session.exec(query))

    for job_id in sorted(jobs_with(good.reuse_key) & jobs_with(bad.reuse_key), reverse=True):
        other = session.get(Job, job_id)
        found = other.attribution if other is not None else None
        if found and (found.last_good, found.first_bad) == (
            good.version, bad.version
        ):  # fmt: skip
            return other
    return None


def note(session: Session, candidates: list[Candidate]) -> str | None:
    """One line per source job: "verdicts of 1.0.5, 1.0.6 reused from job 3"; a job of
    another owner (of the trust group) is never named (rule 8)."""
    reused = [c for c in candidates if c.reused_from is not None]
    if not reused:
        return None
    ids = sorted({c.reused_from for c in reused if c.reused_from is not None})
    query = (
        select(Candidate.id, Candidate.job_id, Job.owner)
        .join(Job, col(Job.id) == col(Candidate.job_id))
        .where(col(Candidate.id).in_(ids))
    )
    source = {row[0]: (row[1], row[2]) for row in session.exec(query)}
    own = session.get(Job, reused[0].job_id)
    mine = own.owner if own is not None else None
    # Keyed by the source job's id, or None for another owner's job: it is not named.
    by_job: dict[int | None, list[str]] = {}
    for c in reused:
        job_id, owner = source.get(c.reused_from, (0, None))  # type: ignore[arg-type]
        by_job.setdefault(job_id if owner == mine else None, []).append(c.version)
    lines = [
        f"verdict{'s' if len(versions) > 1 else ''} of {', '.join(versions)} "
        f"reused from {GROUP_SOURCE if job_id is None else f'job {job_id}'}"
        for job_id, versions in sorted(by_job.items(), key=lambda i: (i[0] is None, i[0] or 0))
    ]
    return "; ".join(lines)
