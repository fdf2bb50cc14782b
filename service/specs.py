"""What a runner is told: the wire specs of a candidate's environment and of a trial."""

from runners.wire import EnvSpec, TrialSpec
from service.models import Candidate, Job, Trial


def env_spec(job: Job, candidate: Candidate) -> EnvSpec:
    # As released: only what the index held the moment the candidate was uploaded.
    exclude_newer = candidate.upload_time if job.as_released else None
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
    )


def trial_spec(job: Job, candidate: Candidate, trial: Trial) -> TrialSpec:
    assert trial.id is not None
    return TrialSpec(
        trial_id=trial.id,
        attempt=trial.attempt,
        kind=trial.kind,
        env=env_spec(job, candidate),
        script=job.script,
        script_name=job.script_name,
        timeout_s=job.timeout_s,
        memory_limit_bytes=job.memory_limit,
        sample_hz=job.sample_hz,
        requires_gpu=job.requires_gpu,
        variables=dict(job.variables),
    )
