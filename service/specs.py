"""What a runner is told: the wire specs of a candidate's environment and of a trial.

Longer runs: a candidate whose runs stay inconclusive gets its next run with two hints
a repro may honour (the README's script contract): `LEAKBISECT_STEPS`, twice the steps
the longest earlier run of the evaluation printed (when it printed step markers), and
`LEAKBISECT_SECONDS`, twice that run's duration. They are the trial's `hints`; the job's
own `--env` variables win over them.

Early stopping (contract/earlystop.py) needs the trial's horizon: how long a trial of
this job runs when nothing stops it. `horizon` takes it from the job's trials that ran
to their end (finished, exit 0, not stopped early): the longest duration and the
largest step count. Until one has, the horizon is unknown and only the cap rule can
stop a trial; so it is while the horizon has no steps or lasted under
`contract.earlystop.MIN_HORIZON_S` (rule 2 there). The planner runs both bounds first:
with one slot (`bisect-cli run` with --jobs 1, or a single runner) the good bound runs
first, clean, to its end, and gives the horizon to every later trial, the bad bound
included; with more slots the bounds run at once and neither has a horizon (both run to
their end unless the cap is near), and the trials queued after them get one.

A traced run (an attribute trial) ends when `trace_stop` says: enough step markers, or
its budget against the candidate's `untraced` run and the job's run seconds
(engine/attribution.py rules 7 and 8); the runner kills it past `hard_timeout`.
"""

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from packaging.utils import canonicalize_name

from contract.outbound import Reach
from contract.wire import CommitRange, EarlyStop, EnvSpec, TraceStop, TrialSpec
from engine import attribution
from engine.analysis import ClassifierSettings
from service import kinds, policy, stages
from service.models import Candidate, Job, Trial, TrialStatus
from service.settings import get_settings


def env_spec(job: Job, candidate: Candidate, *, resolving: bool = False) -> EnvSpec:
    """A candidate's environment; `resolving`: for the resolve trial that makes the pins.

    The job's environment policy says the rest: as released, only what the index held the
    moment the candidate was uploaded; otherwise the pins are resolved as of
    `Job.pins_as_of` (engine/resolution.py) and candidates are then built with them as
    constraints, so the cutoff only applies where they are made.
    """
    if candidate.pins:
        return _held_spec(job, candidate)
    policy = job.env_policy  # service/envpolicy.py
    return EnvSpec(
        package=job.target.package,
        version=_version(job, candidate),
        constraints=list(job.constraints) if policy.shared_pins else [],
        exclude_newer=policy.exclude_newer(
            candidate.upload_time, job.pins_as_of if resolving else None
        ),
        base_env=policy.holds_every_pin,
        source=candidate.source,
        **_job_env(job),
    )


def _reach(job: Job) -> Reach | None:
    """Where the job's URLs may lead on a runner: the API's outbound rule (contract/outbound.py,
    service/policy.py), none for `bisect-cli run`'s own jobs."""
    return None if job.local else policy.reach(get_settings())


def _job_env(job: Job) -> dict[str, Any]:
    """What every candidate's environment takes from the job: python, requirements, indexes,
    and where those may lead."""
    return {
        "reach": _reach(job),
        "python": job.python,
        "requirements": list(job.requirements),
        "index_url": job.index_url,
        "extra_index_urls": list(job.extra_index_urls),
        "find_links": list(job.find_links),
        "pre": job.pre,
    }


def _version(job: Job, candidate: Candidate) -> str:
    """A commit is named by its short hash; uv builds it from `source`, as the bad release."""
    return job.target.bad if candidate.source else candidate.version


def _held_spec(job: Job, candidate: Candidate) -> EnvSpec:
    """A whole environment held exactly (a --from/--to mix or a culprit's release)."""
    pinned = dict(p.split("==", 1) for p in candidate.pins)
    # A mix is named by its first pin, any other by the package its stage moves.
    package = canonicalize_name(stages.package_of(job, candidate.stage))
    if candidate.stage == stages.MIX or package not in pinned:
        package = sorted(pinned)[0]
    version = pinned[package]
    return EnvSpec(
        package=package,
        version=version,
        **_job_env(job),
        constraints=list(candidate.pins),
        base_env=True,
        strict=True,
        source=candidate.source,
    )


def horizon(trials: Sequence[Trial]) -> tuple[float | None, int | None]:
    """(seconds, steps) of the longest trials that ran to their end; None: none did."""
    ended = [
        t
        for t in kinds.runs(trials)
        if t.status == TrialStatus.DONE
        and t.exit_code == 0
        and not t.timed_out
        and t.duration_s
        and not (t.analysis or {}).get("stopped_early")
    ]
    if not ended:
        return None, None
    steps = [int(n) for t in ended if (n := (t.analysis or {}).get("step_count"))]
    return max(float(t.duration_s or 0.0) for t in ended), max(steps) if steps else None


def early_stop(job: Job, trials: Sequence[Trial]) -> EarlyStop | None:
    """The early-stop settings of a trial of `job` (None when the job turned it off):
    the job's classifier thresholds and the horizon of its `trials`."""
    if not job.early_stop:
        return None
    seconds, steps = horizon(trials)
    settings = asdict(ClassifierSettings(**job.classifier))
    shared = {k: v for k, v in settings.items() if k in EarlyStop.model_fields}
    return EarlyStop(
        horizon_s=seconds, horizon_steps=steps, look_every_s=look_every(seconds), **shared
    )


def untraced(candidate: Candidate, trials: Sequence[Trial]) -> tuple[float | None, int | None]:
    """(seconds, steps) of `candidate`'s untraced run: its own longest run to its end, else
    the job's (a leaking release's runs are often stopped early), else its longest run."""
    seconds, steps = horizon([t for t in trials if t.candidate_id == candidate.id])
    if seconds is None:
        seconds, steps = horizon(trials)
    if seconds is None:
        done = [t.duration_s or 0.0 for t in kinds.runs(trials) if t.duration_s]
        seconds = max(done) if done else None
    return seconds, steps


def trace_stop(job: Job, candidate: Candidate, trials: Sequence[Trial]) -> TraceStop:
    """When an attribute trial of `candidate` ends (engine/attribution.py rules 7, 8)."""
    seconds, steps = untraced(candidate, trials)
    over = (TrialStatus.DONE, TrialStatus.CANCELLED)
    ended = [t for t in kinds.traced(trials) if t.status in over]
    return attribution.trace_stop(
        steps=steps,
        untraced_s=seconds,
        min_growth_mib=ClassifierSettings(**job.classifier).min_growth_mib,
        search_s=sum(t.duration_s or 0.0 for t in kinds.runs(trials)),
        spent_s=sum(t.duration_s or 0.0 for t in ended),
        ended=len(ended),
    )


def look_every(seconds: float | None) -> float:
    """Twenty looks or more over a short horizon (the 2 s fixture: only the cap rule looks
    there), every 5 s over a long one."""
    return 5.0 if seconds is None else min(5.0, max(0.1, seconds / 20))


def trial_spec(
    job: Job, candidate: Candidate, trial: Trial, trials: Sequence[Trial] = ()
) -> TrialSpec:
    """What a runner is told for `trial`; `trials`: the job's trials, for the horizon. What
    a kind adds (service/kinds.py): the pins' cutoff (resolve), early stop (a judged run),
    the trace's end (a traced run), the commit range (commits)."""
    assert trial.id is not None
    kind = kinds.handler(trial.kind)
    stop = trace_stop(job, candidate, trials) if kind.traced else None
    return TrialSpec(
        trial_id=trial.id,
        attempt=trial.attempt,
        kind=trial.kind,
        env=env_spec(job, candidate, resolving=kind.resolves),
        script=job.script,
        script_name=job.script_name,
        timeout_s=job.timeout_s if stop is None else attribution.hard_timeout(stop, job.timeout_s),
        memory_limit_bytes=job.memory_limit,
        sample_hz=job.sample_hz,
        requires_gpu=job.requires_gpu,
        variables={**trial.hints, **job.variables},
        early_stop=early_stop(job, trials) if kind.judged else None,
        trace=trial.trace,  # type: ignore[arg-type]
        trace_stop=stop,
        commit_range=commit_range(job) if kind.lists_commits else None,
        owner=job.owner,  # builds per owner: one owner's build backend poisons no other's
    )


def commit_range(job: Job) -> CommitRange:
    """What a commits trial lists: the repository and the boundary's two releases, as the
    commit stage recorded them when it queued the trial (service/pipeline.py)."""
    listing = job.commit
    assert listing is not None and listing.repo is not None  # the commit stage set them
    assert listing.last_good_release is not None and listing.first_bad_release is not None
    return CommitRange(
        repo=listing.repo,
        package=job.target.package,
        good=listing.last_good_release,
        bad=listing.first_bad_release,
        reach=_reach(job),
    )


def longer_run_hints(runs: list[tuple[float | None, int | None]]) -> dict[str, str]:
    """The hints for the next run, from the earlier runs' (duration_s, steps printed)."""
    timed = [(d, steps) for d, steps in runs if d is not None and d > 0]
    if not timed:
        return {}
    duration, steps = max(timed, key=lambda run: run[0])
    hints = {"LEAKBISECT_SECONDS": str(math.ceil(2 * duration))}
    if steps:
        hints["LEAKBISECT_STEPS"] = str(2 * steps)
    return hints
