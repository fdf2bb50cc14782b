"""Run one trial: build the candidate's environment, then the script under the sampler.

`Executor` is the interface every way of running trials implements (the local subprocess
executor here; the Docker executor in `runners.docker`); the agent and `bisect-cli run`
only ever talk to it. ``on_start`` receives a ``kill`` callable as soon as the trial can
be killed: another thread calls it when the lease is lost or the runner stops.
"""

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from runners.envs import EnvError, build_env, resolve_pins
from runners.executor import run_script
from runners.nvml import GpuProbe
from runners.wire import EnvResult, Sample, TrialReport, TrialSpec

Kill = Callable[[], None]


class Executor(Protocol):
    """Runs trials. ``name`` is what runners register and reports show ("local", "docker")."""

    name: str

    def run_trial(
        self,
        spec: TrialSpec,
        *,
        on_sample: Callable[[Sample], None] | None = None,
        on_start: Callable[[Kill], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> TrialReport: ...


class LocalExecutor:
    """Trials as capped, sampled child processes of this one, environments under `env_root`."""

    name = "local"

    def __init__(self, env_root: Path, cache_dir: Path, gpu: GpuProbe | None = None) -> None:
        self.env_root = Path(env_root)
        self.cache_dir = Path(cache_dir)
        self.gpu = gpu

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
) -> TrialReport:
    """Build the environment, run the script, report (a resolve trial: resolve and report pins)."""
    if spec.kind == "resolve":
        return _resolve(spec, cache_dir)
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
            on_start=None if on_start is None else (lambda pgid: on_start(GroupKill(pgid))),
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


def _resolve(spec: TrialSpec, cache_dir: Path) -> TrialReport:
    started = time.monotonic()
    try:
        pins: list[str] | None = resolve_pins(spec.env, cache_dir=cache_dir)
        env = EnvResult(ok=True)
    except EnvError as exc:
        pins, env = None, EnvResult(ok=False, error=str(exc))
    env.seconds = round(time.monotonic() - started, 3)
    return TrialReport(trial_id=spec.trial_id, attempt=spec.attempt, env=env, pins=pins)


class GroupKill:
    """Kills a local trial's process group; ``pgid`` says which (logs and tests read it)."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid

    def __call__(self) -> None:
        if self.pgid == os.getpgrp():  # never our own group
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
