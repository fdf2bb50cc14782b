"""The work of the stages before and after the releases (service/stages.py has the order).

`service/scheduler.py` calls these under the job's lock, after every trial; each says
whether its stage has ended (and then has recorded it with `stages.finish`).

* `mix_step`: one ddmin step (engine/ddmin.py) over the mixes judged so far. A new
  configuration becomes a mix candidate; a minimal set ends the stage, makes the first
  culprit and its two versions the search (`Job.search`; the options stay as submitted)
  and lists its releases as stage "". A bound of that release range is the same
  environment as a mix ddmin judged already (the culprit at its old version is the
  minimal set minus it), so the bound takes that mix's verdicts instead of running again.
  A search that cannot go on ends with ddmin's own answer: bounds_failed where an end
  was judged in the wrong state (`Failed.bounds_failed`), else error.
* `start`: the candidates of a stage that has none yet: a further culprit's releases
  ("release:NAME"), or the boundary's commits ("commit"): a *commits trial* on the first
  bad release asks a runner to list them (runners/commits.py; the server never runs git),
  and its answer becomes one candidate per commit.
* `releases_done`: record the planner's outcome of a stage of versions.
* `attribute_step`: the boundary pair under the cheaper tracer (memray), then under
  tracemalloc only when memray named no site (engine/attribution.py rule 6), each run
  ending at the stop `service.specs.trace_stop` gives it; then their comparison as
  `Job.attribution`, with how each tracer's runs ended (cut short by the budget, or
  stopped with enough steps) and why a tracer did not run. An earlier job that traced
  the same pair under the same conditions (service/reuse.py) is copied instead.
"""

from collections.abc import Sequence
from typing import Any

from sqlmodel import Session

from contract import sources
from contract.wire import TRACERS
from engine import attribution, ddmin
from engine.planner import Outcome, Transition
from engine.releases import RangeError
from service import kinds, reuse, specs, stages
from service.index import LOCAL, PYPI_SIMPLE, FetchPolicy, IndexUnavailable, project_urls
from service.jobs import add_candidates, releases_between
from service.models import Candidate, Job, Trial, TrialKind, TrialStatus
from service.policy import fetch_policy
from service.settings import get_settings
from service.state import (
    Attribution,
    CommitFinding,
    CommitRef,
    Mix,
    Search,
    SearchOutcome,
    StageStatus,
)
from service.state import Transition as TransitionRecord
from service.store import add_trials, candidates_of

MIB = 1024 * 1024
ENDED = (TrialStatus.DONE, TrialStatus.CANCELLED)


def _fetch(job: Job) -> FetchPolicy:
    if job.local:
        return LOCAL
    return fetch_policy(get_settings())


# --- the mix stage -------------------------------------------------------------------


def mix_step(
    session: Session, job: Job, slots: int, members: list[Candidate], running: set[int | None]
) -> bool:
    """Queue the mixes ddmin asks for; True once it has its answer (or cannot go on)."""
    changes = stages.changes_of(job)
    known = {frozenset(c.applied): stages.outcome_of(c) for c in members if c.evaluations}
    busy = [frozenset(c.applied) for c in members if c.id in running]
    answer = ddmin.step(changes, known, slots, running=busy)
    if isinstance(answer, ddmin.Need):
        by_config = {frozenset(c.applied): c for c in members}
        position = stages.next_position(session, job)
        for config in answer.configs:
            candidate = by_config.get(config)
            if candidate is None:
                candidate = stages.new_mix(session, job, config, position)
                position += 1
                session.flush()
            add_trials(session, job, candidate, len(candidate.evaluations) + 1, job.repeats)
        return False
    mixes = [_mix_row(c) for c in members if c.evaluations]
    assert job.dependency is not None  # a --from/--to job starts with it (service/jobs.py)
    if isinstance(answer, ddmin.Failed):
        status = StageStatus.BOUNDS_FAILED if answer.bounds_failed else StageStatus.ERROR
        job.dependency = job.dependency.model_copy(
            update={"mixes": mixes, "message": answer.message}
        )
        stages.finish(job, stages.MIX, status=status, message=answer.message)
        return True
    job.dependency = job.dependency.model_copy(
        update={
            "culprits": list(answer.culprits),
            "certified": answer.certified,
            "untested": [sorted(u) for u in answer.untested],
            "message": answer.message,
            "mixes": mixes,
        }
    )
    stages.finish(job, stages.MIX, status=StageStatus.FOUND, message=answer.message)
    first = next((c for c in answer.culprits if c.old and c.new), None)
    if first is not None:
        assert first.old is not None and first.new is not None
        job.search = Search(package=first.name, good=first.old, bad=first.new)
        try:
            _start_releases(session, job, stages.RELEASES, first.name, members)
        except RangeError as exc:  # listed nothing usable: the set is the answer
            stages.finish(job, stages.RELEASES, status=StageStatus.ERROR, message=str(exc))
    return True


def _mix_row(candidate: Candidate) -> Mix:
    return Mix(
        applied=list(candidate.applied),
        label=candidate.version,
        verdict=candidate.verdict,
        candidate_id=candidate.id,
    )


def _start_releases(
    session: Session, job: Job, stage: str, package: str, mixes: list[Candidate]
) -> list[Candidate]:
    """A culprit's releases from its old to its new version, the other culprits held."""
    change = next(c for c in stages.changes_of(job) if c.name == package)
    found = releases_between(job, package, change.old or "", change.new or "", _fetch(job))
    start = stages.next_position(session, job)
    add_candidates(session, job, found, stage=stage, start=start,
                   pins=lambda version: stages.held_pins(job, package, version))  # fmt: skip
    session.flush()
    created = _of_stage(session, job, stage)
    by_pins = {tuple(m.pins): m for m in mixes if m.evaluations}
    for bound in (created[0], created[-1]):
        mix = by_pins.get(tuple(bound.pins))
        if mix is not None:  # the very environment ddmin judged: its verdicts stand
            bound.evaluations, bound.verdict = list(mix.evaluations), mix.verdict
            bound.growth_mib, bound.freeze = mix.growth_mib, list(mix.freeze or [])
            bound.resolution_note = f"judged as the mix {mix.version!r} (the same environment)"
            session.add(bound)
    return created


def _of_stage(session: Session, job: Job, stage: str) -> list[Candidate]:
    return candidates_of(session, job, stage=stage)


# --- stages of versions --------------------------------------------------------------


def start(session: Session, job: Job, stage: str, trials: list[Trial]) -> list[Candidate] | None:
    """The candidates of a stage that has none yet; [] when the stage ended at once (it
    said why), None while they are being listed (the commit stage's commits trial)."""
    if stage == stages.COMMIT:
        return _start_commits(session, job, trials)
    package = stages.package_of(job, stage)
    mixes = _of_stage(session, job, stages.MIX)
    try:
        return _start_releases(session, job, stage, package, mixes)
    except RangeError as exc:
        stages.finish(job, stage, package=package, status=StageStatus.ERROR, message=str(exc))
        return []


def _start_commits(session: Session, job: Job, trials: list[Trial]) -> list[Candidate] | None:
    """The boundary's commits as candidates, once a runner has listed them (the server
    never runs git: it clones a repository the job names)."""
    listing = kinds.of(TrialKind.COMMITS, trials)
    if not listing:
        return _queue_listing(session, job)
    trial = listing[-1]
    if trial.status not in ENDED:
        return None
    assert job.commit is not None and job.commit.repo is not None  # `_queue_listing` set it
    if trial.commits is None:
        message = f"--commits: {trial.error or 'the listing was cancelled'}"
        job.commit = job.commit.model_copy(update={"status": StageStatus.ERROR, "message": message})
        stages.finish(job, stages.COMMIT, package=job.target.package, status=StageStatus.ERROR,
                      message=message)  # fmt: skip
        return []
    bound = session.get(Candidate, trial.candidate_id)
    held = list(bound.pins) if bound is not None else []
    repo = job.commit.repo
    start_at = stages.next_position(session, job)
    for position, commit in enumerate(trial.commits, start_at):
        session.add(
            Candidate(
                job_id=job.id,  # type: ignore[arg-type]
                position=position,
                version=commit["sha"][:12],
                stage=stages.COMMIT,
                pins=held,
                source=sources.source_ref(repo, commit["sha"]),
                subject=commit["subject"],
            )
        )
    session.flush()
    return _of_stage(session, job, stages.COMMIT)


def _queue_listing(session: Session, job: Job) -> list[Candidate] | None:
    """Queue the commits trial on the first bad release; [] when there is no repository."""
    good, bad = _boundary(job)
    assert good is not None and bad is not None  # the stage runs once stage "" found them
    releases = {c.version: c for c in _of_stage(session, job, stages.RELEASES)}
    try:
        repo = job.repo or _repo_of(job, bad)
    except (sources.CommitsError, IndexUnavailable) as exc:
        stages.finish(job, stages.COMMIT, package=job.target.package, status=StageStatus.ERROR,
                      message=str(exc))  # fmt: skip
        return []
    job.commit = CommitFinding(repo=repo, last_good_release=good, first_bad_release=bad)
    bound = releases[bad]
    add_trials(session, job, bound, len(bound.evaluations), 1, kind=TrialKind.COMMITS)
    return None


def _boundary(job: Job) -> tuple[str | None, str | None]:
    """Stage ""'s boundary pair (last old, first new), as its record names them."""
    found = stages.record(job, stages.RELEASES)
    result = found.result if found is not None else None
    return (result.last_old, result.first_new) if result is not None else (None, None)


def _repo_of(job: Job, version: str) -> str:
    """The source repository named in the release's project URLs (read from the index)."""
    package = job.target.package
    urls = project_urls(package, version, index_url=job.index_url or PYPI_SIMPLE,
                        policy=_fetch(job))  # fmt: skip
    repo = sources.repo_from_urls(urls)
    if repo is None:
        raise sources.CommitsError(
            f"--commits: no source repository in {package} {version}'s project URLs; "
            "give it with --repo URL (or a local clone's path, with bisect-cli run)"
        )
    return repo


def releases_done(
    session: Session, job: Job, stage: str, outcome: Outcome, members: list[Candidate]
) -> None:
    """Record how the planner ended a stage of versions (releases or commits)."""

    def version(index: int | None) -> str | None:
        return None if index is None else members[index].version

    result = SearchOutcome(
        status=StageStatus(outcome.status),
        last_old=version(outcome.last_old),
        first_new=version(outcome.first_new),
        skipped=[members[i].version for i in outcome.skipped],
        message=outcome.message,
        # Every leak/no-leak transition the verdicts show, and the releases that contradict
        # a single boundary (engine/planner.py rule 6): non-monotone ranges said out loud.
        transitions=[_transition(t, members) for t in outcome.transitions],
        disagree=[members[i].version for i in outcome.disagree],
        not_monotone=outcome.not_monotone,
    )
    package = stages.package_of(job, stage)
    # Its second line, so the job's first lines say it (the status stays the first
    # transition's: a real, confirmed boundary).
    message = "\n".join(filter(None, [outcome.message, outcome.not_monotone]))
    if stage == stages.COMMIT:
        assert job.commit is not None  # `_queue_listing` set it
        job.commit = _commit_record(job.commit, members, outcome, result)
        message = job.commit.message
    stages.finish(job, stage, package=package, status=result.status, message=message,
                  result=result)  # fmt: skip


def _transition(transition: Transition, members: list[Candidate]) -> TransitionRecord:
    """One transition as the report shows it (service/schemas.py `TransitionRow`)."""
    below, above = transition.below, transition.above
    return TransitionRecord(
        before=members[below].version,
        after=members[above].version,
        change="starts leaking" if transition.leaks_above else "stops leaking",
        confirmed=transition.confirmed,
        between=[c.version for c in members[below + 1 : above]],
    )


def _commit_record(
    listing: CommitFinding, members: list[Candidate], outcome: Outcome, result: SearchOutcome
) -> CommitFinding:
    """The listing's record with the planner's outcome over the commits, by sha."""

    def entry(c: Candidate) -> CommitRef:
        return CommitRef(sha=(c.source or "").rsplit("@", 1)[-1], subject=c.subject)

    def at(index: int | None) -> CommitRef | None:
        return None if index is None else entry(members[index])

    first, last = at(outcome.first_new), at(outcome.last_old)
    skipped = [entry(members[i]) for i in outcome.skipped]
    unbuildable = [entry(c) for c in members if c.verdict == "skip"]
    if result.status == StageStatus.FOUND and first is not None:
        message = f"first leaking commit: {first.sha[:12]} {first.subject}"
    else:
        message = f"commits: {outcome.message}"
    found = {name: getattr(result, name) for name in result.model_fields_set}
    return listing.model_copy(
        update={**found, "first_bad": first, "last_good": last, "skipped_commits": skipped,
                "unbuildable": unbuildable, "commits": len(members), "message": message}
    )  # fmt: skip


# --- the attribute stage -------------------------------------------------------------


def attribute_step(
    session: Session, job: Job, everything: list[Candidate], trials: list[Trial]
) -> bool:
    """Trace the boundary pair, the cheaper tracer first; True once the comparison is
    stored. Each tracer runs on both releases at once; the next one (tracemalloc) only
    when the last named no site (engine/attribution.py rule 6)."""
    last_old, first_new = _boundary(job)
    releases = {c.version: c for c in everything if c.stage == stages.RELEASES}
    good, bad = releases.get(last_old or ""), releases.get(first_new or "")
    if good is None or bad is None:
        stages.finish(job, stages.ATTRIBUTE, status=StageStatus.ERROR, message=None)
        return True
    traced = kinds.traced(trials)
    if not traced and (source := reuse.find_attribution(session, job, good, bad)):
        assert source.attribution is not None  # found by it
        job.attribution = source.attribution.model_copy(update={"reused_from": source.id})
        message = f"{job.attribution.message} (reused from job {source.id})"
        stages.finish(job, stages.ATTRIBUTE, status=StageStatus.DONE, message=message)
        return True
    if any(t.status not in ENDED for t in traced):
        return False
    ran = [tracer for tracer in TRACERS if any(t.trace == tracer for t in traced)]
    following = TRACERS[len(ran)] if len(ran) < len(TRACERS) else None
    found = compare_traces(job, good, bad, traced, trials) if ran else None
    # The next tracer runs while those so far named no site (rule 6).
    if following is not None and (
        found is None or all(attribution.python_tracer_needed(f) for f in found.tracers.values())
    ):
        for candidate in (good, bad):
            add_trials(session, job, candidate, len(candidate.evaluations),
                       1, kind=TrialKind.ATTRIBUTE, trace=following)  # fmt: skip
        return False
    assert found is not None  # every tracer ran, or one that ran named a site
    job.attribution = found
    stages.finish(job, stages.ATTRIBUTE, status=StageStatus.DONE, message=found.message)
    return True


def compare_traces(
    job: Job, good: Candidate, bad: Candidate, traced: list[Trial], trials: Sequence[Trial] = ()
) -> Attribution:
    """Per tracer: the stacks that grow in `bad` and not in `good` (engine/attribution.py),
    how its runs ended, and for a tracer that did not run, why; `trials`: the job's, for
    the untraced runs the traced ones are measured against."""
    by_tracer: dict[str, Any] = {}
    package = job.target.package
    for tracer in TRACERS:
        pair = {t.candidate_id: t for t in traced if t.trace == tracer}
        if not pair:  # not needed: an earlier tracer named the site
            by_tracer[tracer] = attribution.skipped(tracer)
            continue
        g, b = pair.get(good.id), pair.get(bad.id)
        growth = _growth(b)
        by_tracer[tracer] = attribution.compare(
            _profile(g), _profile(b), package, tracer=tracer,
            rss_growth_bytes=None if growth is None else growth * MIB,
        )  # fmt: skip
        by_tracer[tracer]["seconds"] = {"good": _seconds(g), "bad": _seconds(b)}
        by_tracer[tracer].update(_stops(good, bad, g, b, trials))
    return Attribution(
        package=package,
        last_good=good.version,
        first_bad=bad.version,
        tracers=by_tracer,
        message=_attribution_message(by_tracer),
    )


def _stops(
    good: Candidate, bad: Candidate, g: Trial | None, b: Trial | None, trials: Sequence[Trial]
) -> dict:
    """How the pair's traced runs ended (rule 9), each against its release's untraced run
    (its budget's measure), in the untraced runs' steps."""
    (good_s, _), (bad_s, steps) = specs.untraced(good, trials), specs.untraced(bad, trials)
    runs = {"good": attribution.stop_of(_profile(g)), "bad": attribution.stop_of(_profile(b))}
    return attribution.stops(runs, steps, {"good": good_s, "bad": bad_s})


def _attribution_message(by_tracer: dict[str, Any]) -> str:
    """The top site of the first tracer that found one (and if its budget cut it short,
    that), else what the tracers said."""
    for finding in by_tracer.values():
        if line := attribution.headline(finding):
            return f"{line}; {finding['cut_short']}" if finding.get("cut_short") else line
    notes = [f"{t}: {f['note']}" for t, f in by_tracer.items() if f.get("note")]
    return "; ".join(notes) or "no growing stack found"


def _profile(trial: Trial | None) -> dict[str, Any] | None:
    """The trial's profile; a trial that failed before writing one says why."""
    if trial is None:
        return None
    if trial.profile is None and trial.error:
        return {"error": trial.error.strip().splitlines()[0][:300]}
    return trial.profile


def _growth(trial: Trial | None) -> float | None:
    return None if trial is None else (trial.analysis or {}).get("growth_mib")


def _seconds(trial: Trial | None) -> float | None:
    """How long the traced script ran; None when it never started (the tracer's install)."""
    return None if trial is None or trial.exit_code is None else trial.duration_s
