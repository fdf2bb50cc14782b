"""On a real NVIDIA GPU: every fixture variant judged right, the fixture index bisected.

Marked ``gpu``: these run whenever NVML finds a device (``uv run pytest -m gpu`` runs only
them) and are skipped, saying why, everywhere else. They use the real driver
(libcuda.so.1) and the real NVML through the same functions as bench/gpu_check.py.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.gpu_check import EXPECTED, Backend, bisect_fixture, real_backend, run_variant
from runners.nvml import GpuProbe


def _nvml_device() -> str | None:
    """None when NVML finds a device, else why not."""
    probe = GpuProbe.open()
    if probe is None:
        return "no NVIDIA GPU: NVML found no driver library or no device"
    probe.close()
    return None


_WHY_NOT = _nvml_device()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))]


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    with real_backend("auto") as found:
        assert found is not None, "NVML found a device at import but not now"
        yield found


def test_describes_the_gpu(backend: Backend) -> None:
    info = backend.probe.describe()
    assert info["available"] is True and info["count"] >= 1
    assert info["driver_version"] and info["cuda_driver_version"]
    assert all(d["memory_total"] and d["name"] for d in info["devices"])


@pytest.mark.parametrize("variant", list(EXPECTED))
def test_variant_judged_right(backend: Backend, variant: str, reachable_tmp: Path) -> None:
    check, row = run_variant(backend, variant, reachable_tmp)
    assert row["gpu_source"] in ("process", "device"), row
    assert check.ok, f"{variant}: expected {check.expected}; got {check.got}: {row['reason']}"


def test_fixture_index_bisected(backend: Backend, reachable_tmp: Path, uv_cache: Path) -> None:
    check, facts = bisect_fixture(backend, reachable_tmp, uv_cache)
    assert check.ok, f"expected {check.expected}; got {check.got}"
    assert all(source in ("process", "device") for _, source in facts["trials"])
