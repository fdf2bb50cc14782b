"""The one-node Slurm cluster the Slurm executor's tests need (`.ci/slurm.sh`), or why not.

Outside CI a cluster that does not answer skips those tests with the reason; in CI
(``CI=true``, where `.ci/run` starts one) it fails them: a Slurm test that did not run
there is a failure, never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SETUP = ".ci/slurm.sh"


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Slurm tests: {why}")
    pytest.skip(f"{why} (start one with {SETUP}, as root)")


def cluster() -> str:
    """The node's name once ``scontrol ping`` answers and the node takes jobs."""
    if shutil.which("sbatch") is None:
        unavailable("no Slurm client commands (sbatch) on PATH")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        unavailable(f"no Slurm controller answers: {(ping.stdout + ping.stderr).strip()[:200]}")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                           text=True, check=False).stdout.split()  # fmt: skip
    if len(nodes) < 2 or not nodes[1].startswith(("idle", "mixed", "allocated")):
        unavailable(f"the Slurm node takes no jobs: {' '.join(nodes) or 'none listed'}")
    return nodes[0]


def job(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields of one job."""
    from runners.slurm.batch import parse_job

    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return parse_job(out)
