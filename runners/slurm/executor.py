"""The Slurm executor: every trial one Slurm job, submitted by the runner agent.

Same interface as the local executor (`contract.executor.Executor`). The agent claims
leases as always; `run_trial` turns each into a job (`runners.slurm.batch`: its name,
resources and flags) and follows it:

1. **Submit.** A directory for this submission is made under ``SHARED/trials`` (mode 0700; the
   shared directory is one every node sees at the same path), holding ``trial.json``
   (the spec, the allowlisted environment, where environments and the uv cache live)
   and the batch script, and ``sbatch`` submits it. The job runs `runners.slurm.job` on
   its node, which builds or reuses the environment under ``SHARED/envs`` (the isolation
   rules of `runners.publish`: built privately, published read-only, verified on reuse)
   and runs the script under Slurm's cgroup.
2. **Follow.** Every ``poll_s`` the agent forwards the samples the job appended to
   ``samples.jsonl`` (the heartbeat's memory figure) and reads the job's state with
   ``scontrol show job``. The compute node never needs to reach the API: the agent,
   which can, forwards everything. ``kill`` (a cancelled job, a lost lease, a stopping
   agent) is ``scancel``.
3. **Settle.** Once Slurm says the job ended (`runners.slurm.batch.outcome_of`), its
   ``report.json`` is the trial's report, with Slurm's word added where the job could not
   write it (killed at the allocation's OOM, its time limit, or by us): OUT_OF_MEMORY is an
   OOM kill (``oom_killed``, judged on the samples forwarded so far), TIMEOUT a timeout,
   CANCELLED a killed trial. NODE_FAIL, PREEMPTED and BOOT_FAIL are no outcome of the
   release: `contract.errors.InfrastructureFailure` is raised, and the agent gives the
   lease back (the trial is queued again without using an attempt); `bisect-cli run`
   submits it again.
4. **Restart.** A starting executor cancels the jobs an earlier agent of the same runner
   name left queued or running (their names start ``leakbisect-RUNNER-``) and removes
   their directories: their leases lapse and the API lets the trials again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from contract.errors import InfrastructureFailure, Unavailable
from contract.executor import Kill
from contract.series import downsample
from contract.wire import MAX_REPORT_SAMPLES, EnvResult, Sample, TrialReport, TrialSpec, clip
from runners import safefs
from runners.envs import prepare_dirs
from runners.sandbox import allowed_env
from runners.slurm.batch import (
    Outcome,
    SlurmOptions,
    batch_script,
    exit_code,
    job_name,
    ours,
    outcome_of,
    parse_job,
    sbatch_argv,
)
from runners.slurm.job import REPORT_FILE, SAMPLES_FILE, TRIAL_FILE

COMMANDS = ("sbatch", "scontrol", "scancel", "squeue")
COMMAND_TIMEOUT_S = 30.0
GPU_BINDING = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"})
Log = Callable[[str], None]


def _slurm(*argv: str) -> str:
    """One Slurm command's stdout; `Unavailable` in one line when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"--executor slurm: {argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise Unavailable(f"--executor slurm: {' '.join(argv[:2])}: {why[:200]}")
    return done.stdout


class _Scancel:
    """The trial's kill: ``scancel`` its job (any thread, any number of times)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.cancelled = threading.Event()

    def __call__(self) -> None:
        self.cancelled.set()
        with contextlib.suppress(Unavailable):
            _slurm("scancel", self.job_id)


class _Samples:
    """Follows the job's ``samples.jsonl``: the whole lines appended since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: list[Sample] = []

    def read(self) -> list[Sample]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        new = [Sample.model_validate_json(line) for line in whole.splitlines() if line.strip()]
        self.seen += new
        return new


class SlurmExecutor:
    """Trials as Slurm jobs of the cluster this machine submits to (module docstring)."""

    name = "slurm"

    def __init__(self, runner_name: str, options: SlurmOptions, log: Log | None = None) -> None:
        missing = [c for c in COMMANDS if shutil.which(c) is None]
        if missing:
            raise Unavailable(
                f"--executor slurm: {', '.join(missing)} not found on PATH; "
                "run the runner where Slurm's client commands are installed"
            )
        _slurm("scontrol", "ping")
        self.runner = runner_name
        self.options = options
        self.log = log or (lambda _line: None)
        shared = Path(options.shared_dir)
        if not shared.is_dir():
            raise Unavailable(f"--slurm-dir {shared}: no such directory (it must be one "
                              "every compute node sees at the same path)")  # fmt: skip
        self.trials = shared / "trials"
        self.trials.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.trials, 0o700)  # it holds the jobs' environments: the runner's alone
        self.env_root, self.cache_dir = prepare_dirs(shared / "envs", shared / "cache")
        self.settled = self.settle()

    # -- restart

    def settle(self) -> list[str]:
        """Cancel what an earlier agent of this name left in the queue (rule 4); the ids."""
        listing = _slurm("squeue", "-h", "-u", str(os.getuid()), "-o", "%i|%j")
        left = [line.split("|", 1) for line in listing.splitlines() if "|" in line]
        ids = [job_id for job_id, name in left if ours(self.runner, name)]
        if ids:
            _slurm("scancel", *ids)
            self.log(f"slurm: cancelled {len(ids)} jobs an earlier runner left: {' '.join(ids)}")
        for entry in self.trials.iterdir():
            if ours(self.runner, entry.name):
                safefs.remove_tree(entry)
        return ids

    # -- one trial

    def run_trial(
        self,
        spec: TrialSpec,
        *,
        on_sample: Callable[[Sample], None] | None = None,
        on_start: Callable[[Kill], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> TrialReport:
        trial_dir = self._prepare(spec)
        try:
            job_id = self._submit(spec, trial_dir)
            (log or self.log)(f"trial {spec.trial_id}: slurm job {job_id}")
            kill = _Scancel(job_id)
            if on_start is not None:
                on_start(kill)
            samples = _Samples(trial_dir / SAMPLES_FILE)
            job = self._follow(job_id, samples, on_sample)
            return self._settle(spec, trial_dir, job, samples, kill)
        finally:
            safefs.remove_tree(trial_dir)

    def _prepare(self, spec: TrialSpec) -> Path:
        # A directory per submission (mode 0700): a job orphaned by a failed node that
        # still writes never writes into its resubmission's.
        trial_dir = Path(
            tempfile.mkdtemp(prefix=f"{job_name(self.runner, spec)}-", dir=self.trials)
        )
        env = allowed_env(home=trial_dir, uv=True)
        given = {
            "spec": spec.model_dump(mode="json"),
            # The GPUs are the node's, bound by Slurm: never the agent's own setting.
            "env": {k: v for k, v in env.items() if k not in GPU_BINDING},
            "env_root": str(self.env_root),
            "cache_dir": str(self.cache_dir),
        }
        (trial_dir / TRIAL_FILE).write_text(json.dumps(given))
        script = trial_dir / "job.sh"
        script.write_text(batch_script(self.options.python, trial_dir))
        script.chmod(0o700)
        return trial_dir

    def _submit(self, spec: TrialSpec, trial_dir: Path) -> str:
        argv = sbatch_argv(spec, self.options, self.runner, trial_dir, trial_dir / "job.sh")
        return _slurm(*argv).strip().split(";")[0]

    def _follow(
        self, job_id: str, samples: _Samples, on_sample: Callable[[Sample], None] | None
    ) -> dict[str, str]:
        """Forward samples until Slurm says the job ended; its last `scontrol` fields."""
        while True:
            for sample in samples.read():
                if on_sample is not None:
                    on_sample(sample)
            job = parse_job(_slurm("scontrol", "-o", "show", "job", job_id))
            if outcome_of(job.get("JobState", "")) is not Outcome.RUNNING:
                samples.read()
                return job
            time.sleep(self.options.poll_s)

    def _settle(
        self,
        spec: TrialSpec,
        trial_dir: Path,
        job: dict[str, str],
        samples: _Samples,
        kill: _Scancel,
    ) -> TrialReport:
        """The trial's report from the job's own and from Slurm's word (rule 3)."""
        state = job.get("JobState", "?")
        outcome = outcome_of(state)
        where = f"slurm job {job.get('JobId', '?')} {state}"
        if outcome is Outcome.INFRASTRUCTURE:
            raise InfrastructureFailure(f"{where} on {job.get('NodeList', '?')}: the trial "
                                        "goes back to the queue")  # fmt: skip
        report = _read_report(trial_dir, spec)
        if report is None:
            report = TrialReport(
                trial_id=spec.trial_id, attempt=spec.attempt, env=EnvResult(ok=True),
                exit_code=exit_code(job.get("ExitCode", "")), cap_method="enclosing",
                samples=downsample(samples.seen, MAX_REPORT_SAMPLES),
                samples_taken=len(samples.seen),
                error=None if outcome is not Outcome.ENDED else clip(f"{where}: no report"),
            )  # fmt: skip
        if outcome is Outcome.OOM:
            report = report.model_copy(update={"oom_killed": True})
        elif outcome is Outcome.TIMEOUT:
            report = report.model_copy(update={"timed_out": True})
        elif outcome is Outcome.CANCELLED and not kill.cancelled.is_set():
            report = report.model_copy(update={"error": clip(f"{where}: cancelled outside "
                                                             "leakbisect")})  # fmt: skip
        return report


def _read_report(trial_dir: Path, spec: TrialSpec) -> TrialReport | None:
    try:
        report = TrialReport.model_validate_json((trial_dir / REPORT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if (report.trial_id, report.attempt) != (spec.trial_id, spec.attempt):
        return None
    return report
