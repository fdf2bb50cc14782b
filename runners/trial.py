"""Run one trial: build the candidate's environment, then the script under the sampler.

`Executor` is the interface every way of running trials implements (the local subprocess
executor here; the Docker executor in `runners.docker.executor`); the agent and `bisect-cli run`
only ever talk to it. ``on_start`` receives a ``kill`` callable as soon as the trial can
be killed: another thread calls it when the lease is lost or the runner stops. For the
local executor it is a `runners.executor.TrialKill`, whose ``pgid`` names the trial's
process group.

`execute_trial` is the local executor's work: the build phase of the spec's kind
(`runners.kinds`, the one handler per kind: what each kind does is said there) in this
process, then, for the kinds that run a script, the script: built (or reused) as the
build user, run as the trial user (both when the runner is root: `runners.users`, a user
leased for the trial) in a private working directory (0700, owned by the trial user,
removed afterwards) holding the script, its ``HOME`` and its ``TMPDIR``, all made while
the directory is still root's (`runners.sandbox.private_dir`), with the allowlisted
environment plus the job's own ``variables`` (`runners.sandbox.allowed_env`); under the
kind's tracer, the tracer's helper beside it. The report carries at most
`MAX_REPORT_SAMPLES` samples (`contract.series.downsample`: min and max per time bucket)
and ``samples_taken`` says how many were taken. Git clones are cached under
``cache_dir/git``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from contract.errors import InvalidInput
from contract.executor import Kill
from contract.series import downsample
from contract.wire import MAX_REPORT_SAMPLES, EnvResult, Sample, TrialReport, TrialSpec, clip
from runners import tracing
from runners.envs import prepare_dirs
from runners.executor import run_script
from runners.kinds import Dirs, handler
from runners.limits import CapMethod
from runners.nvml import GpuProbe
from runners.sandbox import allowed_env, private_dir
from runners.users import lease_trial_user
from runners.watch import Execution

SUBDIRS = ("home", "tmp")  # the trial's HOME and TMPDIR, in its work dir


class LocalExecutor:
    """Trials as capped, sampled child processes of this one, environments under `env_root`.

    Creating one checks, once, that the trial and build users exist (creating them when
    the runner is root) and can reach `env_root` and `cache_dir`: a runner that could
    never build an environment fails at start, in one line (`contract.errors.Unavailable`).
    """

    name = "local"

    def __init__(self, env_root: Path, cache_dir: Path, gpu: GpuProbe | None = None) -> None:
        self.gpu = gpu
        # The uv cache may not be the one given: an inherited UV_CACHE_DIR the build user
        # cannot use is replaced (runners.envs `_usable_cache`).
        self.env_root, self.cache_dir = prepare_dirs(Path(env_root), Path(cache_dir))

    def run_trial(
        self,
        spec: TrialSpec,
        *,
        on_sample: Callable[[Sample], None] | None = None,
        on_start: Callable[[Kill], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> TrialReport:
        return execute_trial(
            spec,
            env_root=self.env_root,
            cache_dir=self.cache_dir,
            gpu=self.gpu,
            on_sample=on_sample,
            log=log,
            on_start=on_start,
        )


def execute_trial(
    spec: TrialSpec,
    *,
    env_root: Path,
    cache_dir: Path,
    gpu: GpuProbe | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    log: Callable[[str], None] | None = None,
    on_start: Callable[[Kill], None] | None = None,
    cap_method: CapMethod | None = None,
) -> TrialReport:
    """Do one trial as its kind's handler says (see the module docstring) and report.

    ``cap_method``: the script's `runners.limits.MemoryCap` method (None: the best one
    here; ``"enclosing"`` in a Slurm job, whose allocation is the cap)."""
    kind = handler(spec.kind)
    dirs = Dirs(env_root=env_root, uv_cache=cache_dir, git_cache=cache_dir / "git")
    answer = kind.phase.work(kind.given(kind.env(spec), spec.commit_range), dirs, spec.owner, log)
    ready = kind.settle(spec, answer)
    if isinstance(ready, TrialReport):
        return ready
    try:
        run, profile = _run(spec, ready.python, gpu, on_sample, on_start, cap_method)
    except InvalidInput as exc:  # a BISECT_* variable: nothing ran
        return TrialReport(
            trial_id=spec.trial_id, attempt=spec.attempt, env=ready.env, error=clip(exc.detail())
        )
    return _report(spec, ready.env, run).model_copy(update={"attribution": profile})


def _run(
    spec: TrialSpec,
    python: str,
    gpu: GpuProbe | None,
    on_sample: Callable[[Sample], None] | None,
    on_start: Callable[[Kill], None] | None,
    cap_method: CapMethod | None = None,
) -> tuple[Execution, dict | None]:
    """The script in a private working directory with its own HOME and TMPDIR; under the
    tracer its kind runs it with (`runners.kinds`), if any, and the profile it wrote.

    The script (and the tracer's helper) are written while the directory is root's; the
    trial user gets it only then (`private_dir`), so no one can plant a link at their
    names first, and root reads the profile back only through `runners.safefs`."""
    name, tracer = script_name(spec), handler(spec.kind).tracer(spec)
    files = {name: spec.script.encode()}
    if tracer:
        files[tracing.HELPER_NAME] = tracing.helper_source().encode()
    with (
        lease_trial_user() as trial_user,
        private_dir(trial_user, "leakbisect-trial-", files=files, subdirs=SUBDIRS) as work,
    ):
        env = allowed_env(home=work / "home", tmpdir=work / "tmp", variables=spec.variables)
        command, args, script = work / name, [], work / name
        if tracer:
            command = work / tracing.HELPER_NAME
            args = tracing.helper_args(tracer, work / tracing.PROFILE_NAME, script,
                                       tracing.stop_args(spec.trace_stop))  # fmt: skip
        run = run_script(
            python,
            command,
            args=args,
            name=script.stem,
            cwd=work,
            timeout_s=spec.timeout_s,
            memory_limit_bytes=spec.memory_limit_bytes,
            sample_hz=spec.sample_hz,
            env=env,
            gpu=gpu,
            on_sample=on_sample,
            on_start=on_start,
            run_as=trial_user,
            early_stop=spec.early_stop,
            cap_method=cap_method,
        )
        owner = trial_user.uid if trial_user is not None else None
        profile = tracing.read_profile(work / tracing.PROFILE_NAME, uid=owner) if args else None
        return run, profile


def script_name(spec: TrialSpec) -> str:
    """The script's file name in the work dir: `TrialSpec.script_name`'s last part, or
    ``repro.py`` when that names nothing or a file the runner puts there itself."""
    name = Path(spec.script_name).name
    taken = {"", ".", "..", *SUBDIRS, tracing.HELPER_NAME, tracing.PROFILE_NAME}
    return "repro.py" if name in taken else name


def _report(spec: TrialSpec, env: EnvResult, run: Execution) -> TrialReport:
    steps = run.steps
    if len(steps) > MAX_REPORT_SAMPLES:  # a marker per millisecond: keep the latest
        steps = steps[-MAX_REPORT_SAMPLES:]
    return TrialReport(
        trial_id=spec.trial_id,
        attempt=spec.attempt,
        env=env,
        exit_code=run.exit_code,
        oom_killed=run.oom_killed,
        timed_out=run.timed_out,
        cap_method=run.cap_method,
        duration_s=run.duration_s,
        log_tail=run.log_tail,
        samples=downsample(run.samples, MAX_REPORT_SAMPLES),
        samples_taken=len(run.samples),
        steps=steps,
        gpu_source=run.gpu_source,
        host_source=run.host_source,
        error=clip(run.error),
        stopped_early=run.stopped_early,
        early_stop=run.early_stop,
        missing_protections=run.missing_protections,
    )
