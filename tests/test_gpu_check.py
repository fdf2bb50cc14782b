"""bench/gpu_check.py end to end with --fake (FAKE CUDA driver, FAKE libnvidia-ml), so the
script a maintainer runs on an NVIDIA machine cannot rot; and its refusals."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
VERDICT_LINES = {
    "device-leak": "expected leak, decided by the GPU series; got leak \\(host clean, gpu leak",
    "device-plateau": (
        "expected clean or plateau, never leak; got (clean|plateau) \\(host clean, gpu "
        "(clean|plateau)"
    ),
    "pinned-leak": (
        "expected leak, decided by the host series; the GPU series does not leak; "
        "got leak \\(host leak, gpu clean"
    ),
    "pinned-reuse": (
        "expected clean or plateau \\(spikes, no leak\\); got (clean|plateau) \\(host "
        "(clean|plateau), gpu clean"
    ),
    "oom": (
        "expected leak, the run ending in CUDA out of memory \\(non-zero exit\\); got leak "
        "\\(host clean, gpu leak"
    ),
}


def gpu_check(*args: str, uv_cache: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAKBISECT_")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env={**env, "UV_CACHE_DIR": str(uv_cache)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_fake_run_writes_every_verdict(reachable_tmp: Path, uv_cache: Path) -> None:
    out = reachable_tmp / "gpu-check.md"
    work = reachable_tmp / "w"
    proc = gpu_check("--fake", "--out", str(out), "--work", str(work), uv_cache=uv_cache)
    md = out.read_text() if out.exists() else ""
    failed = [line for line in md.splitlines() if line.startswith("- `") and ": FAIL" in line]
    bisected = md[md.find("## Bisection") : md.find("## Pinned host memory")]
    assert proc.returncode == 0, "\n".join([proc.stderr + proc.stdout, *failed, bisected])
    assert proc.stdout == f"gpu_check: 6 of 6 checks passed; report: {out}\n"
    assert md.startswith("# GPU check (FAKE run, no GPU)\n\n> **FAKE**: ")
    assert "**6 of 6 checks passed**" in md
    lines = [line for line in md.splitlines() if line.startswith("- `") and ": PASS" in line]
    for variant, pattern in VERDICT_LINES.items():
        regex = re.compile(f"^- `{variant}`: PASS: {pattern}")
        assert [line for line in lines if regex.match(line)], (variant, lines)
    bisection = (
        "- `bisection`: PASS: expected found: last good 0.1.4, first bad 0.1.5; visited "
        "0.1.0, 0.1.7, 0.1.3, 0.1.5, 0.1.4, 0.1.4, 0.1.5, 0.1.6; got found: last good 0.1.4, "
        "first bad 0.1.5; visited 0.1.0, 0.1.7, 0.1.3, 0.1.5, 0.1.4, 0.1.4, 0.1.5, 0.1.6"
    )
    assert bisection in md.splitlines()
    assert "| GPUs | FAKE NVML device (4.0 GiB) |" in md
    assert "| process queries | Compute _v3, Graphics _v3, MPSCompute _v3 |" in md
    assert "| status | RssShmem | 0 | 262144 | 262144 |" in md  # the FAKE's pinned pages
    for heading in ("## Bisection", "## Sampling overhead", "## Wall times"):
        assert heading in md
    assert "| 7 | 0.1.5 | leak | process |" in md


def test_fake_needs_out(uv_cache: Path) -> None:
    proc = gpu_check("--fake", uv_cache=uv_cache, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "error: --fake needs --out FILE (a FAKE run must not overwrite docs/gpu-check.md)"
    )


def test_too_few_steps_refused(tmp_path: Path, uv_cache: Path) -> None:
    proc = gpu_check("--fake", "--out", str(tmp_path / "r.md"), "--steps", "3", uv_cache=uv_cache)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "error: --steps: 3 is too few; the classifier needs at least 8 steps"
    )
    assert not (tmp_path / "r.md").exists()


def test_without_a_gpu_it_writes_nothing(tmp_path: Path, uv_cache: Path) -> None:
    # Asked in a fresh process: pynvml keeps the library it loaded, and another module's
    # fake NVML may be that library in this worker.
    probe = "from runners.nvml import GpuProbe; print(GpuProbe.open() is not None)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=60, check=True)  # fmt: skip
    if found.stdout.strip() == "True":
        pytest.skip("NVML finds a GPU here: the no-GPU refusal cannot be observed")
    out = tmp_path / "gpu-check.md"
    proc = gpu_check("--out", str(out), uv_cache=uv_cache, timeout=120)
    assert proc.returncode == 3
    assert proc.stderr == "gpu_check: no NVIDIA GPU here: NVML found no driver or no device\n"
    assert not out.exists()
