"""The Slurm executor on a real one-node cluster (.ci/slurm.sh: slurmctld + slurmd,
task/cgroup with ConstrainRAMSpace, a GRES gpu on a dummy device file), real uv, real jobs.

Marked ``slurm``: skipped with the reason where no cluster answers, failed in CI
(tests/slurm_util.py). The tests of one module run in one worker, one after another, so
the one that kills slurmd never overlaps another's jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.outbound import Reach
from contract.wire import Cause, EnvSpec, Failure, TrialReport, TrialSpec
from engine.analysis import classify_run
from runners.slurm.batch import SlurmOptions, parse_job
from runners.slurm.executor import SlurmExecutor
from service.example.index import serve_index
from tests.slurm_util import cluster, job
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm
MiB = 1 << 20
CLI = [sys.executable, "-m", "service.cli"]
REPO = Path(__file__).resolve().parents[1]

LEAK = """
    import time
    hold = []
    while True:
        print("::leakbisect-step::", flush=True)
        hold.append(bytearray(8 << 20))
        for b in hold[-1:]:
            b[::4096] = b"x" * len(b[::4096])
        time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def node() -> str:
    return cluster()


@pytest.fixture
def executor(node: str, reachable_tmp: Path, request: pytest.FixtureRequest) -> SlurmExecutor:
    shared = reachable_tmp / "shared"
    shared.mkdir()
    options = SlurmOptions(shared_dir=shared, python=sys.executable, poll_s=0.2)
    return SlurmExecutor(f"test-{os.getpid()}-{request.node.name[:30]}", options)


def trial(index: str, script: str, **kw: Any) -> TrialSpec:
    env = EnvSpec(package="leakyfixture", version="1.0.0", index_url=index)
    return TrialSpec(trial_id=kw.pop("trial_id", 1), env=env, script=textwrap.dedent(script),
                     **kw)  # fmt: skip


def run(executor: SlurmExecutor, spec: TrialSpec, **kw: Any) -> tuple[TrialReport, str]:
    """The trial's report and its Slurm job id (from the executor's log line)."""
    lines: list[str] = []
    report = executor.run_trial(spec, log=lines.append, **kw)
    job_id = next(line.split()[-1] for line in lines if ": slurm job " in line)
    return report, job_id


def cli(args: list[str], home: Path, uv_cache: Path, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"),
           "XDG_CACHE_HOME": str(home / "cache"), "UV_CACHE_DIR": str(uv_cache)}  # fmt: skip
    return subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kw)  # fmt: skip


def visited(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(c["version"], c["verdict"]) for c in report["candidates"] if c["trials"]]


def bisect_example(home: Path, uv_cache: Path, *executor: str) -> subprocess.Popen[str]:
    db = home / "r.db"
    args = ["run", "--example", "--json", "--database-url", f"sqlite:///{db}", *executor]
    return cli(args, home, uv_cache)


def finished(proc: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    result["stderr"] = err
    return result


def test_the_example_through_slurm_finds_1_0_6_with_the_local_verdicts(
    node: str, reachable_tmp: Path, uv_cache: Path
) -> None:
    shared = reachable_tmp / "shared"
    shared.mkdir()
    via_slurm = ["--executor", "slurm", "--slurm-dir", str(shared)]
    # Both at once: the local bisection runs while the Slurm one waits on the scheduler.
    procs = {
        "local": bisect_example(reachable_tmp / "local", uv_cache),
        "slurm": bisect_example(reachable_tmp / "slurm", uv_cache, *via_slurm),
    }
    results = {name: finished(proc) for name, proc in procs.items()}
    assert results["slurm"]["status"] == "found"
    assert (results["slurm"]["last_good"], results["slurm"]["first_bad"]) == ("1.0.5", "1.0.6")
    assert visited(results["slurm"]) == visited(results["local"])
    assert list(shared.iterdir()) and list((shared / "trials").iterdir()) == []  # all settled
    bad = next(e for e in results["slurm"]["evidence"] if e["version"] == "1.0.6")
    assert [r["exit_code"] for r in bad["runs"]] == [0, 0]


def test_a_repro_past_its_mem_ends_out_of_memory_and_is_judged_a_leak(
    executor: SlurmExecutor, fixture_index: str
) -> None:
    report, job_id = run(executor, trial(fixture_index, LEAK, memory_limit_bytes=200 * MiB,
                                         timeout_s=120))  # fmt: skip
    slurm = job(job_id)
    assert slurm["JobState"] == "OUT_OF_MEMORY"
    assert "mem=200M" in slurm["TRES"]
    assert report.oom_killed is True and report.timed_out is False
    assert report.cap_method == "enclosing"  # Slurm's cgroup, no second cap
    assert 100 * MiB < max(s.rss for s in report.samples) <= 200 * MiB
    judged = classify_run(
        [s.t for s in report.samples], [s.rss for s in report.samples], None, report.steps,
        exit_code=report.exit_code, oom_killed=report.oom_killed, timed_out=report.timed_out,
    )  # fmt: skip
    assert str(judged.verdict) == "leak"
    assert judged.reason.startswith("killed by the memory cap"), judged.reason


def test_a_kill_is_a_scancel_and_leaves_nothing_running(
    executor: SlurmExecutor, fixture_index: str, request: pytest.FixtureRequest
) -> None:
    tag = f"sleeper-{os.getpid()}-{time.monotonic_ns()}"
    started = threading.Event()
    kills: list[Any] = []

    def killer() -> None:
        started.wait(120)
        kills[0]()

    threading.Thread(target=killer, daemon=True).start()
    script = f"import time\nTAG = {tag!r}\nwhile True: time.sleep(0.1)\n"
    report, job_id = run(executor, trial(fixture_index, script, timeout_s=300),
                         on_start=kills.append, on_sample=lambda _s: started.set())  # fmt: skip
    assert job(job_id)["JobState"] == "CANCELLED"
    assert report.oom_killed is False and report.samples
    assert report.exit_code is not None and report.exit_code < 0
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    assert left == ""


def _served_with_a_slurm_runner(
    name: str, tmp_path: Path, reachable_tmp: Path, uv_cache: Path
) -> tuple[Any, Path]:
    """`bisect-cli serve` (no runners of its own) and `bisect-cli runner --executor slurm`
    named `name`, its files under ``reachable_tmp/shared``; the service and the runner's log."""
    from tests.test_cli_service import Service, make_env

    shared = reachable_tmp / "shared"
    shared.mkdir()
    svc = Service(tmp_path, make_env(tmp_path, reachable_tmp, uv_cache))
    svc.start_serve(f"sqlite:///{tmp_path / 'svc.db'}")
    log = tmp_path / "runner.log"
    with log.open("a") as err:
        svc.runners.append(subprocess.Popen(
            CLI + ["runner", "--server", svc.url, "--name", name, "--executor", "slurm",
                   "--slurm-dir", str(shared)],
            stdout=subprocess.DEVNULL, stderr=err, env=svc.env,
        ))  # fmt: skip
    return svc, log


def test_a_job_cancelled_through_the_api_reaches_scancel_from_the_runner(
    node: str, tmp_path: Path, reachable_tmp: Path, uv_cache: Path, fixture_index: str
) -> None:
    """`bisect-cli runner --executor slurm` against a live server: a cancelled job's trial
    is the runner's to kill (its heartbeat is answered 409), and killing it is scancel."""
    name = f"cancelled-{os.getpid()}"
    svc, log = _served_with_a_slurm_runner(name, tmp_path, reachable_tmp, uv_cache)
    sleeper = "import time\nprint('::leakbisect-step::', flush=True)\ntime.sleep(120)\n"
    try:
        with svc.client() as api:
            job_id = api.submit({"package": "leakyfixture", "range": "1.0.0..1.0.1",
                                 "script": sleeper, "index_url": fixture_index,
                                 "timeout_s": 300, "reuse_verdicts": False})["id"]  # fmt: skip
            sleeping = wait_until(lambda: _running_sleeper(log), 180, "the sleeper's job",
                                  explain=log.read_text)  # fmt: skip
            api.cancel(job_id)
            wait_until(lambda: job(sleeping)["JobState"] == "CANCELLED", 60, "the scancel",
                       explain=log.read_text)  # fmt: skip
            assert api.get_job(job_id)["status"] == "cancelled"
    finally:
        svc.stop()
    text = log.read_text()
    assert f": slurm job {sleeping}" in text and "Traceback" not in text


def _running_sleeper(log: Path) -> str | None:
    """The sleeper's Slurm job once it runs: the runner's second job (its first is the
    job's resolve trial, which may itself run for seconds and end on its own)."""
    jobs = re.findall(r": slurm job (\d+)", log.read_text())
    if len(jobs) < 2 or job(jobs[1])["JobState"] != "RUNNING":
        return None
    return jobs[1]


def test_a_gpu_trial_is_submitted_with_the_gres_and_a_cpu_trial_without(
    executor: SlurmExecutor, fixture_index: str
) -> None:
    probe = "import os, sys\nsys.exit(7 if os.environ.get('CUDA_VISIBLE_DEVICES') == '0' else 3)\n"
    gpu, gpu_job = run(executor, trial(fixture_index, probe, requires_gpu=True, trial_id=1))
    cpu, cpu_job = run(executor, trial(fixture_index, probe, trial_id=2))
    assert job(gpu_job)["TresPerNode"] == "gres:gpu:1"
    assert "TresPerNode" not in job(cpu_job)
    assert (gpu.exit_code, cpu.exit_code) == (7, 3)  # the script saw the GPU Slurm bound


def test_a_restarted_runner_cancels_the_jobs_it_had_left_and_no_one_elses(
    node: str, reachable_tmp: Path
) -> None:
    runner = f"restarted-{os.getpid()}"
    names = [f"leakbisect-{runner}-t5-a1", f"leakbisect-{runner}-x-t5-a1", "leakbisect-t5-a1"]
    ids = [
        subprocess.run(["sbatch", "--parsable", f"--job-name={name}", "--mem=50M",
                        "--output=/dev/null", "--wrap", "sleep 300"],
                       capture_output=True, text=True, check=True).stdout.strip()
        for name in names
    ]  # fmt: skip
    try:
        shared = reachable_tmp / "shared"
        (shared / "trials" / f"{names[0]}-abc123").mkdir(parents=True)
        (shared / "trials" / f"{names[1]}-abc123").mkdir()
        ex = SlurmExecutor(runner, SlurmOptions(shared_dir=shared, python=sys.executable))
        assert ex.settled == ids[:1]
        wait_until(lambda: job(ids[0])["JobState"] == "CANCELLED", 30, "the cancel")
        assert [job(i)["JobState"] for i in ids[1:]] in (
            [s, t] for s in ("PENDING", "RUNNING") for t in ("PENDING", "RUNNING")
        )
        assert sorted(p.name for p in (shared / "trials").iterdir()) == [f"{names[1]}-abc123"]
    finally:
        subprocess.run(["scancel", *ids], check=False)


def _kill_the_node_under(job_id: str) -> None:
    """What a node failure does to a job: slurmd, the job's slurmstepd and every process of
    the job gone at once."""
    procs = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True)
    pids = [int(f.split()[0]) for f in procs.stdout.splitlines()[1:] if f.split()[:1] != ["-1"]]
    subprocess.run(["pkill", "-9", "-x", "slurmd"], check=False)
    subprocess.run(["pkill", "-9", "-f", f"slurmstepd: \\[{job_id}\\."], check=False)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def slurmd_restored(node: str) -> Iterator[None]:
    """Whatever the test does to slurmd, the node takes jobs again afterwards."""
    yield
    subprocess.run(["bash", str(REPO / ".ci/slurm.sh")], check=True, capture_output=True,
                   timeout=120)  # fmt: skip
    cluster()


def _fail_the_node_under_a_running_trial(prefix: str, node: str) -> str:
    """Waits for a job named ``prefix...`` to run, fails its node (slurmd and the job's
    processes killed), waits for Slurm's NODE_FAIL and starts slurmd again; the job's id."""
    victim = wait_until(lambda: _running_job_of(node, prefix), 300, "a trial's job to run")
    _kill_the_node_under(victim)
    wait_until(lambda: job(victim)["JobState"] == "NODE_FAIL", 60, "Slurm to fail the job")
    subprocess.Popen(["/usr/sbin/slurmd"]).wait(30)
    return victim


def _submitted_again(victim: str) -> list[str]:
    """The states of the jobs of the same trial and attempt submitted after `victim`."""
    name = job(victim)["JobName"]
    return [j["JobState"] for j in _jobs_named(name) if int(j["JobId"]) > int(victim)]


def test_slurmd_killed_mid_trial_bisect_cli_run_submits_it_again_and_finds_1_0_6(
    node: str, reachable_tmp: Path, uv_cache: Path, slurmd_restored: None
) -> None:
    shared = reachable_tmp / "shared"
    shared.mkdir()
    # Three releases around the first bad one: the failure lands in the bounds' check, and
    # the search after it is the one the example test already follows whole.
    proc = bisect_example(reachable_tmp, uv_cache, "--executor", "slurm", "--slurm-dir",
                          str(shared), "--range", "1.0.5..1.0.7")  # fmt: skip
    try:
        victim = _fail_the_node_under_a_running_trial("leakbisect-run-", node)
        result = finished(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (result["status"], result["first_bad"]) == ("found", "1.0.6")
    assert _submitted_again(victim) == ["COMPLETED"]


def test_slurmd_killed_mid_trial_the_runner_returns_the_trial_and_the_job_finds_1_0_6(
    node: str,
    tmp_path: Path,
    reachable_tmp: Path,
    uv_cache: Path,
    fixture_index: str,
    slurmd_restored: None,
) -> None:
    """Through the API: the runner gives the lease back (no attempt used), the trial is let
    again, and the job's answer is the one without the failure."""
    from tests.test_cli_service import REPRO

    name = f"failed-node-{os.getpid()}"
    svc, log = _served_with_a_slurm_runner(name, tmp_path, reachable_tmp, uv_cache)
    submit = subprocess.Popen(
        CLI + ["submit", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.7",
               "--index-url", fixture_index, "--wait", "--json", "--server", svc.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=svc.env,
    )  # fmt: skip
    try:
        victim = _fail_the_node_under_a_running_trial(f"leakbisect-{name}-", node)
        trial_id = int(job(victim)["JobName"].rsplit("-t", 1)[1].split("-a")[0])
        out, err = submit.communicate(timeout=600)
        assert submit.returncode == 0, err[-2000:] + log.read_text()[-2000:]
        with svc.client() as api:
            trial = api.get_trial(trial_id)
    finally:
        if submit.poll() is None:
            submit.kill()
        svc.stop()
    report = json.loads(out)
    assert (report["last_good"], report["first_bad"]) == ("1.0.5", "1.0.6")
    assert (trial["status"], trial["attempt"]) == ("done", 1)  # the failure used no attempt
    assert _submitted_again(victim) == ["COMPLETED"]
    text = log.read_text()
    assert f"trial {trial_id}: lease given back (slurm job {victim} NODE_FAIL on {node}" in text


def _jobs_named(name: str) -> list[dict[str, str]]:
    out = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True)
    return [j for j in map(parse_job, out.stdout.splitlines()) if j.get("JobName") == name]


def _running_job_of(node: str, prefix: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-t", "R", "-w", node, "-o", "%i %j"],
                         capture_output=True, text=True).stdout.split()  # fmt: skip
    return out[0] if len(out) >= 2 and out[1].startswith(prefix) else None


def test_the_executors_benchmark_writes_its_report_for_all_three(node: str, tmp_path: Path) -> None:
    from bench.executors import main

    out = tmp_path / "bench.md"
    assert main(["--repeats", "2", "--out", str(out)]) == 0
    text = out.read_text()
    for row in ("local: whole trial", "docker minus local, per trial",
                "slurm minus local, per trial", "slurm: submit to start",
                "slurm: a bare job (sbatch --wait /bin/true)"):  # fmt: skip
        assert f"| {row}" in text, row
    assert "Not measured" not in text
    with pytest.raises(SystemExit) as refused:
        main(["--repeats", "1", "--out", str(out)])
    assert refused.value.code == 2


def test_a_build_the_egress_rule_refuses_is_the_infrastructure_s_on_the_node(
    executor: SlurmExecutor, fixture_wheels: Path
) -> None:
    """The job builds on the node with the local executor's work (runners/slurm/job.py), its
    egress proxy there: the index is listed, its files' port is not, and the report says so
    typed (issue 35 item 4), never as the release's failure."""
    with serve_index(fixture_wheels) as files:
        port = files.split(":")[2].split("/")[0]
        with serve_index(fixture_wheels, files_at=f"http://127.0.0.1:{port}/files/") as index:
            env = EnvSpec(package="leakyfixture", version="1.0.0", index_url=index,
                          reach=Reach(hosts=(index.split("/")[2],)))  # fmt: skip
            report, job_id = run(executor, TrialSpec(trial_id=1, env=env, script="pass\n"))
    rule, host = "host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES", f"127.0.0.1:{port}"
    refused = Failure(cause=Cause.REFUSED, host=host, rule=rule,
                      message=f"the job's outbound rule refused {host}: {rule}")  # fmt: skip
    # The job wrote its report and exited 1 (a failed build, runners/slurm/job.py): Slurm's
    # FAILED, not a node's failure; the report's cause is what the runner names.
    assert job(job_id)["JobState"] == "FAILED"
    assert (report.env.ok, report.env.error, report.exit_code) == (False, refused.message, None)
    assert report.infrastructure == refused
