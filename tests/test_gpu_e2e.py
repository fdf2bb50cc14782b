"""End to end: `bisect-cli run` bisects the GPU fixture index (real uv, real child processes).

As tests/test_run_e2e.py does for the CPU fixture, but every trial runs the GPU repro
against the FAKE CUDA driver (tests/fake_cuda.c, its path baked into the releases), and the
CLI's own `GpuProbe.open()` finds the FAKE libnvidia-ml (tests/fake_libnvml.c) through
LD_LIBRARY_PATH under the real pynvml: the GPU series travels the whole real path.
"""

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.example.gpu.fixture import GpuFixtureSpec, build_gpu_fixture
from service.example.index import serve_index
from tests.fake_cuda import build_fake_cuda, build_fake_libnvml

REPRO = Path(__file__).resolve().parents[1] / "service" / "example" / "gpu" / "repro.py"
CLI = [sys.executable, "-m", "service.cli"]
GOOD = ("device-plateau", "pinned-reuse")
BAD = ("device-leak", "pinned-leak")


@pytest.fixture(scope="module")
def gpu_index(reachable_dir: Callable[[str], Path]) -> Iterator[tuple[str, Path]]:
    """(index URL, directory of the FAKE libnvidia-ml) for the module."""
    root = reachable_dir("gpu-e2e")  # the trial user loads the FAKE libcuda from here
    cuda = build_fake_cuda(root / "cuda")
    nvml = build_fake_libnvml(root / "nvml", cuda.usage_dir, total_mib=cuda.total_mib)
    wheels = build_gpu_fixture(root / "wheels", GpuFixtureSpec(cuda_library=str(cuda.library)))
    with serve_index(wheels) as url:
        yield url, nvml.parent


@pytest.fixture(scope="module")
def bisection(
    reachable_dir: Callable[[str], Path], gpu_index: tuple[str, Path], uv_cache: Path
) -> tuple[subprocess.CompletedProcess[str], Path]:
    index, nvml_dir = gpu_index
    home = reachable_dir("home")
    db = home / "results.db"
    # Every run to its end: this module pins what the GPU path records over whole runs (both
    # series judged, 40 GPU samples each). Early stopping, which reads the host series, is
    # tested end to end in tests/test_run_e2e.py and tests/test_docker_executor.py.
    args = [
        "run", str(REPRO), "--package", "gpuleakfixture", "--range", "0.1.0..0.1.7",
        "--index-url", index, "--database-url", f"sqlite:///{db}", "--json", "--no-early-stop",
    ]  # fmt: skip
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LEAKBISECT_")},
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "UV_CACHE_DIR": str(uv_cache),
        "LD_LIBRARY_PATH": str(nvml_dir),
    }
    proc = subprocess.run(CLI + args, capture_output=True, text=True, env=env, timeout=600)
    return proc, db


def test_finds_the_first_leaking_gpu_release(bisection) -> None:
    proc, _ = bisection
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "found"
    assert (report["last_good"], report["first_bad"]) == ("0.1.4", "0.1.5")
    assert report["between"] == [] and report["skipped"] == []
    verdicts = {c["version"]: c["verdict"] for c in report["candidates"]}
    assert verdicts == {
        "0.1.0": "plateau",
        "0.1.1": None,
        "0.1.2": None,
        "0.1.3": "plateau",
        "0.1.4": "plateau",
        "0.1.5": "leak",
        "0.1.6": "leak",  # the witness above the first bad (engine/planner.py rule 5)
        "0.1.7": "leak",
    }
    assert report["dependency_diff"] == [
        {"package": "gpuleakfixture", "last_good": "0.1.4", "first_bad": "0.1.5"}
    ]
    gpu = report["machine"]["gpu"]
    assert (gpu["name"], gpu["count"], gpu["driver_version"]) == (
        "FAKE NVML device",
        1,
        "999.99.99-FAKE",
    )


def test_trials_visited_and_judged_on_both_series(bisection) -> None:
    proc, db = bisection
    assert proc.returncode == 0, proc.stderr
    con = sqlite3.connect(db)
    rows = con.execute(
        "select c.version, t.verdict, t.exit_code, t.gpu_source, t.analysis from trial t "
        "join candidate c on c.id = t.candidate_id where t.kind = 'run' order by t.id"
    ).fetchall()
    visited = [(version, verdict, code, source) for version, verdict, code, source, _ in rows]
    # Bounds, binary search, the boundary pair again, then the witness above the first bad
    # (engine/planner.py rule 5); every GPU figure per process.
    assert visited == [
        ("0.1.0", "plateau", 0, "process"),
        ("0.1.7", "leak", 0, "process"),
        ("0.1.3", "plateau", 0, "process"),
        ("0.1.5", "leak", 0, "process"),
        ("0.1.4", "plateau", 0, "process"),
        ("0.1.4", "plateau", 0, "process"),
        ("0.1.5", "leak", 0, "process"),
        ("0.1.6", "leak", 0, "process"),
    ]
    for version, verdict, _, _, analysis in rows:
        series = json.loads(analysis)
        if verdict == "leak":
            # device-leak and pinned-leak together: each series leaks on its own.
            assert (series["gpu"]["verdict"], series["host"]["verdict"]) == ("leak", "leak"), (
                version
            )
        else:
            # The caching pool is a GPU plateau; the pinned checkpoint spikes are not a leak.
            assert series["gpu"]["verdict"] == "plateau", version
            assert series["host"]["verdict"] in ("clean", "plateau"), version
    gpu_samples = con.execute(
        "select count(*) from memory_sample where gpu is not null"
    ).fetchone()[0]
    assert gpu_samples >= 8 * 40
