"""What a trial's Slurm job runs on the compute node: ``python -m runners.slurm.job DIR``.

``DIR`` is the trial's directory on the shared filesystem, made by the agent
(`runners.slurm.executor`), mode 0700: ``trial.json`` holds the spec, the allowlisted
environment the job may see (`runners.sandbox.allowed_env`: the job was submitted with
``--export=NONE``), and where environments and the uv cache live. The job then does what
the local executor does (`runners.trial.execute_trial`: build or reuse the environment in
this job, then the script under the supervisor and the sampler), with one difference: the
cap is Slurm's (`runners.limits.MemoryCap.enclosing`: the job's own cgroup, sized by
``--mem``), so an OOM kill is one Slurm reports as OUT_OF_MEMORY and no second cap fights it.
The sampler reads this node's processes and NVML directly (no PID namespace between them).

What it writes to ``DIR``, for the agent to forward whether or not this node can reach
the API: ``samples.jsonl``, one sample per line as it is taken; ``report.json`` at the end
(written to a temporary name and renamed: the agent never reads half a report). It exits
with the script's exit status (a signal N as 128 + N), so Slurm's own accounting
(``ExitCode``, COMPLETED or FAILED) says what the report says.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO

from contract.errors import LeakbisectError
from contract.wire import EnvResult, Sample, TrialReport, TrialSpec, clip
from runners.nvml import open_probe
from runners.trial import execute_trial

TRIAL_FILE = "trial.json"
SAMPLES_FILE = "samples.jsonl"
REPORT_FILE = "report.json"


def write_report(trial_dir: Path, report: TrialReport) -> None:
    tmp = trial_dir / f".{REPORT_FILE}.tmp"
    tmp.write_text(report.model_dump_json())
    os.replace(tmp, trial_dir / REPORT_FILE)


def exit_status(report: TrialReport) -> int:
    code = report.exit_code
    if code is None:
        return 1 if (report.error or not report.env.ok) else 0
    return 128 - code if code < 0 else min(code, 255)


def main(argv: list[str]) -> int:
    trial_dir = Path(argv[0])
    given = json.loads((trial_dir / TRIAL_FILE).read_text())
    spec = TrialSpec.model_validate(given["spec"])
    os.environ.update(given["env"])  # Slurm's own SLURM_*/CUDA_VISIBLE_DEVICES stay
    gpu = open_probe("yes") if spec.requires_gpu else None  # the GRES is this job's alone
    samples: IO[str]
    with (trial_dir / SAMPLES_FILE).open("a", buffering=1) as samples:

        def on_sample(sample: Sample) -> None:
            samples.write(sample.model_dump_json() + "\n")

        try:
            report = execute_trial(
                spec,
                env_root=Path(given["env_root"]),
                cache_dir=Path(given["cache_dir"]),
                gpu=gpu,
                on_sample=on_sample,
                log=lambda line: print(line, file=sys.stderr, flush=True),
                cap_method="enclosing",
            )
        except LeakbisectError as exc:  # no cap here (no --mem, no cgroup): nothing ran
            report = TrialReport(
                trial_id=spec.trial_id,
                attempt=spec.attempt,
                env=EnvResult(ok=True),
                error=clip(f"slurm job: {exc}"),
            )
    write_report(trial_dir, report)
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
