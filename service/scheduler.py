"""Advancing jobs: close finished evaluations, ask the planner, queue trials.

The planner and the classifier decide; this module only moves rows. Both the
local `bisect-cli run` loop and the service call `advance` after every
completed trial, so the two modes walk exactly the same path.

Concurrency: two runners completing trials of one job at once must not both
queue the planner's picks. `advance` and `cancel` hold the job's lock
(`queue.job_lock`: the job row `FOR UPDATE` on Postgres, a process lock on
SQLite). Callers commit their own changes before calling either.

A trial that ended on its infrastructure failures (service/queue.py, infrastructure rules)
ends its job as an error naming the cause (`_infrastructure_spent`), before the planner is
asked: a release the runners could not build is never stepped around as untestable.

Every ending (concluded, stopped at its budget or by the infrastructure, cancelled) passes
`ended`, in the job's transaction: it writes the webhooks the end sends (service/webhooks.py).

Evaluations (`_close_or_extend`): a candidate's `repeats` runs judged together, run
again while that is inconclusive up to `max_runs`; one that still ends inconclusive is
judged with the candidate's earlier evaluations' runs (engine/pooled.py
`classify_evaluations`) and takes that verdict where it agrees with them. The planner
reads the list of evaluation verdicts (engine/planner.py: only leak against bounded
contradicts).

Verdict reuse (service/reuse.py, whose rules these follow): a pick that an earlier
job of the same owner already judged, as strongly as a fresh run would, under the
same conditions is not queued; its verdict is copied as one evaluation and the
planner is asked again, until it picks something that needs running or the search
is over. A bound that fails on a reused verdict alone is run before the job fails,
and each step first marks the earlier verdicts this job's own runs contradict.
"""

from collections import defaultdict
from statistics import median

from sqlalchemy import func
from sqlmodel import Session, col, select

from engine.planner import Plan, ReleaseState, plan
from engine.pooled import PooledAnalysis, PooledRun, classify_evaluations, classify_runs
from engine.verdicts import Verdict
from service import kinds, pins, pipeline, policy, queue, reuse, stages, webhooks
from service.envpolicy import EnvPair
from service.models import Candidate, Job, JobStatus, Trial, TrialStatus, utcnow
from service.specs import longer_run_hints
from service.state import SearchOutcome, StageStatus
from service.store import add_trials, candidates_of, steps_printed, trials_of
from service.trials import classifier_settings, ending_failure, infrastructure_stop, skip_why

# Marks the lines of job.message that `advance` owns (reuse notes).
REUSE_MARK = " reused from job "


def slots_for(session: Session, job: Job, *, within_s: float = 60) -> int:
    """Free slots for k-section: live runners able to run the job (GPU jobs: with a GPU)."""
    able = [
        r
        for r in queue.live_runners(session, within_s=within_s)
        if not job.requires_gpu or r.gpu_count > 0
    ]
    return max(1, len(able))


def _close_or_extend(
    session: Session, job: Job, candidate: Candidate, trials: list[Trial], earlier: list[Trial]
) -> bool:
    """Settle the candidate's open evaluation (`trials`); True while it is still running.

    Its runs are judged together (engine/pooled.py) from the floors each run's analysis
    already holds: microseconds under the job lock, no samples reloaded. One that ends
    inconclusive is judged again with the runs of the candidate's earlier evaluations
    (`earlier`: engine/pooled.py `classify_evaluations`), whose verdict it takes when that
    agrees with them: an inconclusive evaluation contradicts nothing, and its runs are
    more evidence for the verdict it was asked to confirm (engine/planner.py rule 4).
    """
    if any(t.status in (TrialStatus.QUEUED, TrialStatus.LEASED) for t in trials):
        return True
    done = [t for t in trials if t.verdict]
    together = classify_runs([_pooled_run(t) for t in done], classifier_settings(job))
    n = len(done)
    if n < job.repeats:
        add_trials(session, job, candidate, trials[0].evaluation, 1)
        return True
    if together.verdict is Verdict.INCONCLUSIVE and n < job.max_runs:
        # Inconclusive after the repeats asked for: the next run is asked to run longer.
        steps = steps_printed(session, [t.id for t in done if t.id is not None])
        hints = longer_run_hints([(t.duration_s, steps.get(t.id)) for t in done])  # type: ignore[arg-type]
        add_trials(session, job, candidate, trials[0].evaluation, 1, hints)
        return True
    pooled = together.to_dict() if together.runs >= 2 else None
    if together.verdict is Verdict.INCONCLUSIVE and candidate.evaluations:
        across = _across(job, candidate, done, earlier)
        together = across if across.verdict.decisive else together
        pooled = across.to_dict() if across.runs >= 2 else pooled
    verdict = together.verdict
    candidate.evaluations = [*candidate.evaluations, verdict.value]
    candidate.verdict = verdict.value
    candidate.pooled = None if pooled is None else {**pooled, "evaluation": trials[0].evaluation}
    growth = [
        t.analysis["growth_mib"]
        for t in trials
        if t.analysis and t.analysis.get("growth_mib") is not None
    ]
    candidate.growth_mib = median(growth) if growth else None
    session.add(candidate)
    return False


def _across(
    job: Job, candidate: Candidate, latest: list[Trial], earlier: list[Trial]
) -> PooledAnalysis:
    """The candidate's runs of every evaluation so far judged together (engine/pooled.py
    `classify_evaluations`): each earlier evaluation its recorded verdict and its runs (none
    for one copied from another job)."""
    runs: dict[int, list[PooledRun]] = defaultdict(list)
    for trial in earlier:
        if trial.verdict:
            runs[trial.evaluation].append(_pooled_run(trial))
    before = [
        (Verdict(v), runs.get(number, [])) for number, v in enumerate(candidate.evaluations, 1)
    ]
    return classify_evaluations(before, [_pooled_run(t) for t in latest], classifier_settings(job))


def _pooled_run(trial: Trial) -> PooledRun:
    normal = trial.exit_code == 0 and not trial.oom_killed and not trial.timed_out
    return PooledRun(Verdict(trial.verdict), trial.analysis, normal)  # type: ignore[arg-type]


def _states(
    candidates: list[Candidate], running: set[int | None], why: dict[int | None, str]
) -> list[ReleaseState]:
    return [
        ReleaseState(
            version=c.version,
            testable=c.testable,
            verdicts=tuple(Verdict(v) for v in c.evaluations),
            running=c.id in running,
            why=why.get(c.id),
        )
        for c in candidates
    ]


def _skipped_bounds(session: Session, candidates: list[Candidate]) -> dict[int | None, str]:
    """Why a skipped bound could not be judged, where its runs say which (its script's exit
    125, uv's no resolution, no distribution, the repro cannot run on it: service/trials.py
    `skip_why`); the planner's bounds message names it. Only the bounds: an interior skip
    is stepped around whatever its reason."""
    bounds = (candidates[0], candidates[-1])
    ids = [c.id for c in bounds if c.evaluations and c.evaluations[-1] == Verdict.SKIP]
    if not ids:
        return {}
    query = select(Trial).where(col(Trial.candidate_id).in_(ids), kinds.JUDGED)
    runs = session.exec(query.order_by(col(Trial.id))).all()
    return {t.candidate_id: why for t in runs if (why := skip_why(t.analysis))}


def _with_note(base: str | None, note: str | None) -> str | None:
    lines = [line for line in (base or "").splitlines() if REUSE_MARK not in line]
    if note:
        lines.append(note)
    return "\n".join(lines) or None


def advance(
    session: Session,
    job: Job,
    slots: int,
    budget: int | None = None,
    operator_webhook: bool = False,
) -> Plan:
    """Move `job` one step: returns the planner's answer after queueing its picks.

    `budget`: the most trials the job may have (any but cancelled ones, the queued included;
    the API's BISECT_MAX_TRIALS_PER_JOB, None for `bisect-cli run`). A step that needs more
    stops the job as an error, its open trials cancelled: a search that does not converge
    ends instead of taking the runners for ever. `operator_webhook`: BISECT_WEBHOOK_URL is
    set, so a job that ends is told there too (`ended`).
    """
    with queue.job_lock(session, job):
        if JobStatus(job.status).finished:
            return Plan(run=(), outcome=None)
        trials = trials_of(session, job)
        if (spent := _infrastructure_spent(session, job, trials)) is not None:
            step = _stop(session, job, spent)
        elif pins.pending(session, job, trials):
            step = Plan(run=(), outcome=None)  # the resolve trial comes first
        else:
            step = _plan(session, job, slots, trials)
        running = not JobStatus(job.status).finished
        if budget is not None and running and _trials_used(session, job) > budget:
            step = _stop(session, job, policy.budget_spent(budget))
        if step.outcome is None and job.status == JobStatus.QUEUED:
            job.status = JobStatus.RUNNING
        if JobStatus(job.status).finished:  # it was not when this step began
            ended(session, job, operator_webhook)
        job.updated_at = utcnow()
        session.add(job)
        session.commit()
        return step


def ended(session: Session, job: Job, operator_webhook: bool) -> None:
    """What follows a job's end, in its transaction: the webhooks it sends (service/webhooks.py).
    The one place every ending passes (`advance`: concluded or stopped; `cancel`)."""
    webhooks.enqueue(session, job, operator_webhook)


def _open_evaluations(
    session: Session, job: Job, candidates: list[Candidate], trials: list[Trial]
) -> set[int | None]:
    """Settle every candidate's open evaluation; the ids of those still running."""
    by_id = {c.id: c for c in candidates}
    open_trials: dict[int, list[Trial]] = defaultdict(list)
    closed: dict[int, list[Trial]] = defaultdict(list)  # earlier evaluations' runs
    for trial in trials:
        if trial.status == TrialStatus.CANCELLED or not kinds.judged(trial):
            continue
        if trial.evaluation > len(by_id[trial.candidate_id].evaluations):
            open_trials[trial.candidate_id].append(trial)
        else:
            closed[trial.candidate_id].append(trial)
    return {
        c.id
        for c in candidates
        if c.id in open_trials
        and _close_or_extend(session, job, c, open_trials[c.id], closed[c.id])  # type: ignore[index]
    }


def _plan(session: Session, job: Job, slots: int, trials: list[Trial]) -> Plan:
    """Walk the job's stages (service/stages.py) until one has work running or queued."""
    everything = candidates_of(session, job, stage=None)
    running = _open_evaluations(session, job, everything, trials)
    last = Plan(run=(), outcome=None)
    while (stage := stages.current(job)) is not None:
        members = [c for c in everything if c.stage == stage]
        if stage == stages.MIX:
            done = pipeline.mix_step(session, job, slots, members, running)
        elif stage == stages.ATTRIBUTE:
            done = pipeline.attribute_step(session, job, everything, trials)
        else:
            if not members:
                started = pipeline.start(session, job, stage, trials)
                if started is None:  # a runner lists them (the commits trial)
                    return Plan(run=(), outcome=None)
                if not started:  # nothing to list (no repository, no tags): it said why
                    continue
                members = started
            last = _releases(session, job, slots, stage, members, running)
            if last.outcome is not None:
                pipeline.releases_done(session, job, stage, last.outcome, members)
            done = last.outcome is not None
        if not done:
            return Plan(run=last.run if last.outcome is None else (), outcome=None)
        # A stage's outcome can come while speculative evaluations still run (the
        # planner's rule 5): none of them can change it, and the next stage starts clean.
        queue.cancel_open_trials(session, job)
        everything = candidates_of(session, job, stage=None)
    conclude(session, job, [c for c in everything if c.stage == stages.RELEASES])
    return last


def _releases(
    session: Session,
    job: Job,
    slots: int,
    stage: str,
    candidates: list[Candidate],
    running: set[int | None],
) -> Plan:
    """One planner step over a stage of versions (releases or commits) and its queueing."""
    # Verdict reuse keys on the job's own environment rules: only its plain releases.
    reusable = stage == stages.RELEASES and not isinstance(job.env_policy, EnvPair)
    if reusable:
        reuse.ensure_keys(session, job, candidates)
        reuse.mark_contradictions(session, job, candidates)
    reused = False
    why = _skipped_bounds(session, candidates)
    # --all-transitions maps the job's own range; culprit releases and commits, found
    # from its first transition, are searched for their first.
    every = job.all_transitions and stage == stages.RELEASES
    # No witness among commits: each is built from source, and their range lies inside a
    # confirmed release boundary.
    witness = stage != stages.COMMIT
    while True:
        states = _states(candidates, running, why)
        step = plan(states, slots, find_fix=job.find_fix, all_transitions=every,
                    witness=witness)  # fmt: skip
        # Copy what earlier jobs already know, then ask again with it.
        if not reusable:
            break
        if not any([reuse.try_reuse(session, job, candidates[i]) for i in step.run]):
            break
        reused = True
    if reusable and (stale := reuse.stale_bounds(candidates, job.find_fix)):
        # A bound in the wrong state on a reused verdict alone (the planner said
        # bounds_failed) runs once before the job can fail on it.
        step = Plan(run=tuple(i for i in stale if candidates[i].id not in running), outcome=None)
    for index in step.run:
        candidate = candidates[index]
        add_trials(session, job, candidate, len(candidate.evaluations) + 1, job.repeats)
    if reused and step.outcome is None:
        job.message = _with_note(job.message, reuse.note(session, candidates))
    return step


def _infrastructure_spent(session: Session, job: Job, trials: list[Trial]) -> str | None:
    """The job's message when one of its trials ended on its infrastructure failures
    (service/queue.py, infrastructure rules): no verdict of any release can be trusted to
    come while the runners cannot build, so the job ends as an error naming the cause,
    never stepping around the release as if it were untestable."""
    spent = ending_failure(trials)
    if spent is None:
        return None
    candidate = session.get(Candidate, spent.candidate_id)
    assert candidate is not None
    return infrastructure_stop(spent, candidate, stages.package_of(job, candidate.stage))


def _trials_used(session: Session, job: Job) -> int:
    """The job's trials that ran, run or wait to (the ones this step queued included)."""
    query = select(func.count()).select_from(Trial)
    query = query.where(Trial.job_id == job.id, col(Trial.status) != TrialStatus.CANCELLED)
    return session.exec(query).one()


def _stop(session: Session, job: Job, message: str) -> Plan:
    """End the job as an error with `message` first, its open trials cancelled."""
    job.status = JobStatus.ERROR
    job.message = "\n".join(filter(None, [message, job.message]))
    job.finished_at = utcnow()
    job.result = SearchOutcome(status=StageStatus.ERROR, message=message)
    queue.cancel_open_trials(session, job)
    return Plan(run=(), outcome=None)


def conclude(session: Session, job: Job, candidates: list[Candidate]) -> None:
    """End the job once its stages have: stage ""'s status (or the mix stage's, when it
    found no culprit), the stages' messages first, and cancel whatever still runs."""
    ended = stages.ending(job)
    job.status = JobStatus(ended.status)
    # The outcomes lead; notes written at creation (pins that did not resolve) stay below.
    message = "\n".join(filter(None, [*stages.messages(job), job.message]))
    job.message = _with_note(message, reuse.note(session, candidates))
    job.finished_at = utcnow()
    job.result = ended.result or SearchOutcome(status=ended.status, message=ended.message)
    queue.cancel_open_trials(session, job)


def cancel(
    session: Session,
    job: Job,
    message: str = "cancelled on request",
    operator_webhook: bool = False,
) -> bool:
    """Cancel an unfinished job and its open trials; False when it had already finished."""
    with queue.job_lock(session, job):
        if JobStatus(job.status).finished:
            return False
        job.status = JobStatus.CANCELLED
        job.message = _with_note(message, reuse.note(session, candidates_of(session, job)))
        job.finished_at = job.updated_at = utcnow()
        session.add(job)
        queue.cancel_open_trials(session, job)
        ended(session, job, operator_webhook)
        session.commit()
        return True
