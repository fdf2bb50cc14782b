"""The pure part of the Slurm executor: the job a trial becomes, and what Slurm's answer means.

Rules, in code order:

1. **One job per trial**, named ``leakbisect-RUNNER-tTRIAL-aATTEMPT`` (`job_name`): the name
   says which trial, and the prefix ``leakbisect-RUNNER-`` is how a restarted agent finds the
   jobs it had submitted (`ours`).
2. **The job's resources come from the trial** (`sbatch_argv`): ``--mem`` is the job's
   memory cap in MiB, rounded up (none: the partition's default allocation, which
   ``task/cgroup`` caps all the same); ``--time`` is the trial's timeout plus the minutes
   the runner allows for building its environment in the same job, rounded up to whole
   minutes; ``--gres=gpu:1`` for a GPU trial and no GRES at all for a CPU one; partition,
   account and QoS only when the runner names them. Always ``--no-requeue`` (a job that
   lost its node comes back to *us* as NODE_FAIL, and the trial goes back to leakbisect's
   queue, never re-run by Slurm behind our back), ``--export=NONE`` (the agent's
   environment, its runner token included, never reaches the job: the job reads the
   allowlisted variables from its own directory), one task on one node.
3. **Slurm's state, read from `scontrol show job`**, is one of four outcomes
   (`outcome_of`): still going (PENDING, CONFIGURING, RUNNING, COMPLETING, SUSPENDED,
   REQUEUED and the like); ``ENDED`` (COMPLETED, or FAILED: the script's exit code is in
   the job's report and in Slurm's ExitCode); ``OOM`` (OUT_OF_MEMORY: the allocation's
   cgroup killed something, which with a rising floor is a leak); ``TIMEOUT`` (TIMEOUT,
   DEADLINE); ``CANCELLED``; and ``INFRASTRUCTURE`` (NODE_FAIL, PREEMPTED, BOOT_FAIL,
   and any state this module does not know): no verdict, the trial goes back to the queue.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from contract.wire import TrialSpec

MIB = 1024 * 1024
DEFAULT_BUILD_MINUTES = 30


class Outcome(StrEnum):
    RUNNING = "running"
    ENDED = "ended"
    OOM = "oom"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INFRASTRUCTURE = "infrastructure"


GOING = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                   "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING",
                   "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})  # fmt: skip
STATES: dict[str, Outcome] = {
    "COMPLETED": Outcome.ENDED,
    "FAILED": Outcome.ENDED,
    "OUT_OF_MEMORY": Outcome.OOM,
    "TIMEOUT": Outcome.TIMEOUT,
    "DEADLINE": Outcome.TIMEOUT,
    "CANCELLED": Outcome.CANCELLED,
    "NODE_FAIL": Outcome.INFRASTRUCTURE,
    "PREEMPTED": Outcome.INFRASTRUCTURE,
    "BOOT_FAIL": Outcome.INFRASTRUCTURE,
}


@dataclass(frozen=True)
class SlurmOptions:
    """What the runner's options say about the cluster (`bisect-cli runner --executor slurm`).

    ``shared_dir``: a directory every compute node sees at the same path (the trials'
    spool, the uv cache and the environments live under it); ``python``: the interpreter
    that runs `runners.slurm.job` on the node (this project installed, on a shared path);
    ``poll_s``: how often the agent reads the job's state and its samples."""

    shared_dir: Path
    python: str
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    build_minutes: int = DEFAULT_BUILD_MINUTES
    poll_s: float = 0.5


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def prefix(runner: str) -> str:
    """The start of every job name this runner submits."""
    return f"leakbisect-{_UNSAFE.sub('_', runner)[:64]}-"


def job_name(runner: str, spec: TrialSpec) -> str:
    return f"{prefix(runner)}t{spec.trial_id}-a{spec.attempt}"


def ours(runner: str, name: str) -> bool:
    """Whether a job (or its directory: the name and a suffix) is one `runner` submitted;
    never one of a runner whose name merely starts the same ("node" and "node-3")."""
    return re.fullmatch(re.escape(prefix(runner)) + r"t\d+-a\d+(-\w+)?", name) is not None


def time_limit_minutes(spec: TrialSpec, build_minutes: int) -> int:
    return max(1, math.ceil(spec.timeout_s / 60) + build_minutes)


def sbatch_argv(
    spec: TrialSpec, options: SlurmOptions, runner: str, trial_dir: Path, script: Path
) -> list[str]:
    """The ``sbatch`` command that submits `spec` as one job (rule 2)."""
    argv = [
        "sbatch", "--parsable", f"--job-name={job_name(runner, spec)}",
        "--export=NONE", "--no-requeue", "--nodes=1", "--ntasks=1",
        f"--chdir={trial_dir}", f"--output={trial_dir / 'slurm.out'}",
        f"--time={time_limit_minutes(spec, options.build_minutes)}",
    ]  # fmt: skip
    if spec.memory_limit_bytes is not None:
        argv.append(f"--mem={math.ceil(spec.memory_limit_bytes / MIB)}M")
    if spec.requires_gpu:
        argv.append("--gres=gpu:1")
    for flag, value in (("partition", options.partition), ("account", options.account),
                        ("qos", options.qos)):  # fmt: skip
        if value:
            argv.append(f"--{flag}={value}")
    return [*argv, str(script)]


def batch_script(python: str, trial_dir: Path) -> str:
    """The job's script: the trial's own entry point on the node, nothing else."""
    return (
        "#!/bin/sh\n"
        "# leakbisect: one trial (runners/slurm/job.py reads its directory)\n"
        f"exec {shlex.quote(python)} -m runners.slurm.job {shlex.quote(str(trial_dir))}\n"
    )


def parse_job(text: str) -> dict[str, str]:
    """``scontrol -o show job ID``'s one line as a dict (values never hold spaces but
    Command=/WorkDir= may: those, the last fields, are kept whole)."""
    fields: dict[str, str] = {}
    key = None
    for token in text.strip().split(" "):
        name, eq, value = token.partition("=")
        if eq and re.fullmatch(r"[A-Za-z][A-Za-z0-9_:/]*", name):
            key = name
            fields[key] = value
        elif key is not None:
            fields[key] += " " + token
    return fields


def outcome_of(state: str) -> Outcome:
    """Rule 3: what a job in ``state`` (``JobState``, e.g. ``CANCELLED`` or
    ``CANCELLED by 0``) means for its trial."""
    word = state.split()[0].rstrip("+") if state.strip() else ""
    if word in GOING:
        return Outcome.RUNNING
    return STATES.get(word, Outcome.INFRASTRUCTURE)


def exit_code(field_value: str) -> int | None:
    """Slurm's ``ExitCode=STATUS:SIGNAL`` as an exit status (-SIGNAL when signalled)."""
    status, _, signal = field_value.partition(":")
    if not status.isdigit():
        return None
    if signal.isdigit() and int(signal):
        return -int(signal)
    return int(status)
