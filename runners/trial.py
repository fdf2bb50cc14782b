"""Run one trial: build the candidate's environment, then the script under the sampler."""

import tempfile
from collections.abc import Callable
from pathlib import Path

from runners.envs import EnvError, build_env
from runners.executor import run_script
from runners.nvml import GpuProbe
from runners.wire import EnvResult, Sample, TrialReport, TrialSpec


def execute_trial(
    spec: TrialSpec,
    *,
    env_root: Path,
    cache_dir: Path,
    gpu: GpuProbe | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    log: Callable[[str], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> TrialReport:
    """Build the environment, run the script, report.

    ``on_start`` gets the script's pid (= its process group id) as soon as it
    runs, so another thread can kill the trial (`runners.agent` does on a 409).
    """
    try:
        env: EnvResult = build_env(spec.env, root=env_root, cache_dir=cache_dir, log=log)
    except EnvError as exc:
        env = EnvResult(ok=False, error=str(exc))
    if not env.ok or env.python_executable is None:
        return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env)
    with tempfile.TemporaryDirectory(prefix="leakbisect-trial-") as work:
        script = Path(work) / Path(spec.script_name).name
        script.write_text(spec.script)
        run = run_script(
            env.python_executable,
            script,
            cwd=Path(work),
            timeout_s=spec.timeout_s,
            memory_limit_bytes=spec.memory_limit_bytes,
            sample_hz=spec.sample_hz,
            gpu=gpu,
            on_sample=on_sample,
            on_start=on_start,
        )
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
        samples=run.samples,
        steps=run.steps,
        gpu_source=run.gpu_source,
        host_source=run.host_source,
    )
