"""The Slurm executor's pure part (runners/slurm/batch.py): the job a trial becomes and
what each of Slurm's states means for the trial. No cluster needed."""

from pathlib import Path

import pytest

from contract.wire import EnvSpec, TrialSpec
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

OPTIONS = SlurmOptions(shared_dir=Path("/shared"), python="/opt/venv/bin/python")
DIR = Path("/shared/trials/t")


def spec(**kw: object) -> TrialSpec:
    env = EnvSpec(package="leakyfixture", version="1.0.6", index_url="http://127.0.0.1:1/simple")
    return TrialSpec(trial_id=7, attempt=2, env=env, script="print(1)\n", **kw)  # type: ignore[arg-type]


def test_a_cpu_trial_is_one_task_capped_timed_and_without_a_gres() -> None:
    argv = sbatch_argv(spec(memory_limit_bytes=200 * 2**20 + 1, timeout_s=61), OPTIONS,
                       "gpu box 1", DIR, DIR / "job.sh")  # fmt: skip
    assert argv == [
        "sbatch", "--parsable", "--job-name=leakbisect-gpu_box_1-t7-a2", "--export=NONE",
        "--no-requeue", "--nodes=1", "--ntasks=1", "--chdir=/shared/trials/t",
        "--output=/shared/trials/t/slurm.out", "--time=32", "--mem=201M", "/shared/trials/t/job.sh",
    ]  # fmt: skip
    assert not any(a.startswith(("--gres", "--gpus")) for a in argv)


def test_a_gpu_trial_asks_for_one_gpu_and_the_runners_partition_account_and_qos() -> None:
    options = SlurmOptions(shared_dir=Path("/s"), python="py", partition="a100", account="ml",
                           qos="low", build_minutes=5)  # fmt: skip
    argv = sbatch_argv(spec(requires_gpu=True, timeout_s=600), options, "r", DIR, DIR / "j")
    assert "--gres=gpu:1" in argv
    assert argv[-4:] == ["--partition=a100", "--account=ml", "--qos=low", "/shared/trials/t/j"]
    assert "--time=15" in argv
    assert not any(a.startswith("--mem") for a in argv)  # no cap asked: the partition's


def test_job_names_say_which_trial_and_which_runner_submitted_them() -> None:
    name = job_name("node-3", spec())
    assert name == "leakbisect-node-3-t7-a2"
    assert ours("node-3", name) and ours("node-3", f"{name}-k2x_9q")
    assert not ours("node-30", name) and not ours("node", name)


def test_the_batch_script_runs_the_trials_entry_and_nothing_else() -> None:
    text = batch_script("/opt/my venv/bin/python", Path("/s/trials/it's"))
    assert text.splitlines()[-1] == (
        "exec '/opt/my venv/bin/python' -m runners.slurm.job '/s/trials/it'\"'\"'s'"
    )


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        ("PENDING", Outcome.RUNNING), ("RUNNING", Outcome.RUNNING),
        ("COMPLETING", Outcome.RUNNING), ("COMPLETED", Outcome.ENDED),
        ("FAILED", Outcome.ENDED), ("OUT_OF_MEMORY", Outcome.OOM),
        ("TIMEOUT", Outcome.TIMEOUT), ("DEADLINE", Outcome.TIMEOUT),
        ("CANCELLED", Outcome.CANCELLED), ("CANCELLED by 0", Outcome.CANCELLED),
        ("NODE_FAIL", Outcome.INFRASTRUCTURE), ("PREEMPTED", Outcome.INFRASTRUCTURE),
        ("BOOT_FAIL", Outcome.INFRASTRUCTURE), ("SOMETHING_NEW", Outcome.INFRASTRUCTURE),
        ("", Outcome.INFRASTRUCTURE),
    ],
)  # fmt: skip
def test_each_slurm_state_means_one_outcome(state: str, outcome: Outcome) -> None:
    assert outcome_of(state) is outcome


def test_scontrol_lines_and_exit_codes_are_read_as_slurm_writes_them() -> None:
    line = ("JobId=13 JobName=leakbisect-r-t9-a1 JobState=OUT_OF_MEMORY Reason=OutOfMemory "
            "ExitCode=0:125 NodeList=vm Command=/s/t/job.sh --x y WorkDir=/s/t\n")  # fmt: skip
    job = parse_job(line)
    assert job["JobState"] == "OUT_OF_MEMORY" and job["NodeList"] == "vm"
    assert job["Command"] == "/s/t/job.sh --x y" and job["WorkDir"] == "/s/t"
    assert [exit_code(v) for v in ("0:0", "3:0", "0:9", "", "x:1")] == [0, 3, -9, None, None]
