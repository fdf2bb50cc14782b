"""Per-trial cost of each executor on one machine: subprocess (local), Docker and Slurm.

``uv run python -m bench.executors [--repeats N] [--slurm-dir DIR] [--out docs/bench-executors.md]``

The same trial on each: ``run_trial`` of a one-line script whose environment is already
built (``leakyfixture==1.0.2`` from the offline fixture index on 127.0.0.1; one warm-up
trial each builds it), N times. Each figure is the median over N (p90 in brackets), seconds:

- **whole trial**: the call, from the agent's side;
- **the script itself**: the trial's ``duration_s``, so the difference is what each
  executor adds around the script (the reuse check of the environment included);
- **minus local**: each executor's whole trial less the local one's, sorted pairwise;
- Slurm only: **submit to start**, the job's ``StartTime`` less its ``SubmitTime`` as
  ``scontrol`` reports them (whole seconds: Slurm's resolution), and a **bare job**,
  ``sbatch --wait`` of ``/bin/true``: the scheduler's share without leakbisect.

An executor that is not here (no Docker engine or image; no Slurm cluster answering) is
left out of the table with the reason. Needs, for Docker, the images
(``dockerfiles/build-base.sh && uv run python -m runners.docker.images``); for Slurm, a
cluster (``.ci/slurm.sh`` starts a one-node one) and ``--slurm-dir`` (default: a directory
under the work dir, which on one node every "node" sees).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.docker import _s, _trials, render
from contract.errors import Unavailable
from contract.wire import EnvSpec, TrialReport, TrialSpec
from runners.slurm.batch import SlurmOptions, parse_job
from runners.slurm.executor import SlurmExecutor
from runners.trial import LocalExecutor
from service.example.fixture import build_fixture
from service.example.index import serve_index

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "bench-executors.md"
SCRIPT = "print('hello')\n"


def _spec(index_url: str) -> TrialSpec:
    env = EnvSpec(package="leakyfixture", version="1.0.2", index_url=index_url)
    return TrialSpec(trial_id=1, env=env, script=SCRIPT, timeout_s=60,
                     memory_limit_bytes=256 << 20)  # fmt: skip


def _docker(work: Path) -> Callable[[TrialSpec], TrialReport]:
    from runners.docker.executor import DockerExecutor

    ex = DockerExecutor.from_env(runner_name=f"bench-{os.getpid()}",
                                 cache_volume="leakbisect-bench-cache")  # fmt: skip
    return ex.run_trial


class _Slurm:
    """The Slurm executor, remembering each trial's job id for Slurm's own timestamps."""

    def __init__(self, shared: Path) -> None:
        options = SlurmOptions(shared_dir=shared, python=sys.executable, poll_s=0.1)
        self.ex = SlurmExecutor(f"bench-{os.getpid()}", options)
        self.jobs: list[str] = []

    def __call__(self, spec: TrialSpec) -> TrialReport:
        log = lambda line: self.jobs.append(line.split()[-1])  # noqa: E731 - "trial N: slurm job ID"
        return self.ex.run_trial(spec, log=log)

    def submit_to_start(self) -> list[float]:
        out = []
        for job_id in self.jobs[1:]:  # not the warm-up's
            text = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip
            job = parse_job(text)
            start, submit = (time.mktime(time.strptime(job[k], "%Y-%m-%dT%H:%M:%S"))
                             for k in ("StartTime", "SubmitTime"))  # fmt: skip
            out.append(start - submit)
        return out


def _bare_jobs(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run(["sbatch", "--wait", "--quiet", "--mem=50M", "--output=/dev/null",
                        "--wrap", "/bin/true"], check=True)  # fmt: skip
        out.append(time.monotonic() - t0)
    return out


def measure(repeats: int, work: Path, index_url: str, shared: Path) -> tuple[dict, list[str]]:
    spec = _spec(index_url)
    local = LocalExecutor(work / "envs", work / "uv-cache")
    lt, ls = _trials(lambda: local.run_trial(spec), repeats)
    rows = {"local: whole trial": _s(lt), "local: the script itself": _s(ls)}
    absent: list[str] = []
    others: list[tuple[str, Callable[[], Callable[[TrialSpec], TrialReport]]]] = [
        ("docker", lambda: _docker(work)), ("slurm", lambda: _Slurm(shared)),
    ]  # fmt: skip
    for name, make in others:
        try:
            run = make()
        except Unavailable as exc:
            absent.append(f"{name}: {exc}")
            continue
        totals, scripts = _trials(lambda run=run: run(spec), repeats)
        rows[f"{name}: whole trial"] = _s(totals)
        rows[f"{name}: the script itself"] = _s(scripts)
        rows[f"{name} minus local, per trial"] = _s(
            [a - b for a, b in zip(sorted(totals), sorted(lt), strict=True)]
        )
        if isinstance(run, _Slurm):
            rows["slurm: submit to start (Slurm's timestamps, whole seconds)"] = _s(
                run.submit_to_start()
            )
            rows["slurm: a bare job (sbatch --wait /bin/true)"] = _s(_bare_jobs(repeats))
    return rows, absent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.executors", description=__doc__)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--slurm-dir",
        type=Path,
        default=None,
        help="shared directory of the Slurm executor (default: under the work dir)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error("--repeats: at least 2 (a median and a p90 of one run say nothing)")
    work = Path(tempfile.mkdtemp(prefix="leakbisect-bench-executors-"))
    work.chmod(0o755)  # the sandbox users must reach the local executor's environments
    shared = args.slurm_dir or work / "slurm"
    shared.mkdir(exist_ok=True)
    wheels = build_fixture(work / "wheels")
    with serve_index(wheels) as url:
        rows, absent = measure(args.repeats, work, url, shared)
    command = f"uv run python -m bench.executors --repeats {args.repeats}"
    notes = tuple(f"Not measured: {why}" for why in absent)
    title = "Executors: per-trial overhead (subprocess, Docker, Slurm)"
    text = render(rows, command, args.repeats, title=title, script="bench/executors.py",
                  notes=notes)  # fmt: skip
    args.out.write_text(text)
    for k, v in rows.items():
        print(f"{k}: {v}")
    for why in absent:
        print(f"not measured: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
