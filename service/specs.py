"""What a runner is told: the wire specs of a candidate's environment and of a trial.

Longer runs: a candidate whose runs stay inconclusive gets its next run with two hints
a repro may honour (the README's script contract): `LEAKBISECT_STEPS`, twice the steps
the longest earlier run of the evaluation printed (when it printed step markers), and
`LEAKBISECT_SECONDS`, twice that run's duration. They are the trial's `hints`; the job's
own `--env` variables win over them.
"""

import math

from runners.wire import EnvSpec, TrialSpec
from service.models import Candidate, Job, Trial, TrialKind


def env_spec(job: Job, candidate: Candidate, *, resolving: bool = False) -> EnvSpec:
    """A candidate's environment; `resolving`: for the resolve trial that makes the pins.

    As released, only what the index held the moment the candidate was uploaded. The
    pins are resolved as of `Job.pins_as_of` (service/resolution.py); candidates are then
    built with them as constraints, so the cutoff only applies where they are made.
    """
    if job.as_released:
        exclude_newer = candidate.upload_time
    else:
        exclude_newer = job.pins_as_of if resolving else None
    return EnvSpec(
        package=job.package,
        version=candidate.version,
        python=job.python,
        requirements=list(job.requirements),
        index_url=job.index_url,
        extra_index_urls=list(job.extra_index_urls),
        find_links=list(job.find_links),
        pre=job.pre,
        constraints=[] if job.as_released else list(job.constraints),
        exclude_newer=exclude_newer,
        base_env=job.base_env is not None,
    )


def trial_spec(job: Job, candidate: Candidate, trial: Trial) -> TrialSpec:
    assert trial.id is not None
    return TrialSpec(
        trial_id=trial.id,
        attempt=trial.attempt,
        kind=trial.kind,
        env=env_spec(job, candidate, resolving=trial.kind == TrialKind.RESOLVE),
        script=job.script,
        script_name=job.script_name,
        timeout_s=job.timeout_s,
        memory_limit_bytes=job.memory_limit,
        sample_hz=job.sample_hz,
        requires_gpu=job.requires_gpu,
        variables={**trial.hints, **job.variables},
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
