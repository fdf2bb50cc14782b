"""`GpuProbe` over the real pynvml module, which loads a FAKE libnvidia-ml (tests/fake_libnvml.c).

This pins the code against pynvml's actual API: its ctypes structs and two-call size
protocol, NVML_VALUE_NOT_AVAILABLE -> None, the function-not-found errors of a driver that
lacks the _v3 or _v2 queries, and the unsuffixed Python query, which is a _v3 wrapper
(raising NVMLLibraryMismatchError on old drivers), not the v1 query.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.nvml import GpuProbe
from tests.fake_cuda import (
    build_fake_libnvml,
    can_unshare_pid,
    load_fake_libnvml,
    published_from_a_pid_namespace,
    usage_name,
)

MiB = 2**20


@pytest.fixture(scope="module")
def usage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A published usage directory: this test process 300 MiB, its parent 100 MiB."""
    d = tmp_path_factory.mktemp("nvml-usage")
    (d / usage_name(os.getpid())).write_text(f"{300 * MiB}\n")
    (d / usage_name(os.getppid())).write_text(f"{100 * MiB}\n")
    (d / usage_name(2147483646)).write_text(f"{999 * MiB}\n")  # a pid nobody has: not listed
    return d


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory, usage: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fake-libnvml")
    return {v: build_fake_libnvml(root / v, usage, versions=v) for v in ("v3", "v2", "v1")}


@pytest.fixture
def unknown(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("LEAKBISECT_FAKE_NVML_UNKNOWN", "1")
    yield


@pytest.mark.parametrize("newest", ["v3", "v2", "v1"])
def test_per_process_memory_with_the_newest_query_the_driver_has(
    libs: dict[str, Path], newest: str
) -> None:
    with load_fake_libnvml(libs[newest]) as pynvml:
        probe = GpuProbe.open(pynvml)
        assert probe is not None
        try:
            assert probe.sample({os.getpid()}) == (300 * MiB, "process")
            assert probe.sample({os.getpid(), os.getppid()}) == (400 * MiB, "process")
            version = f"_{newest}"
            assert probe.query_versions() == {
                "Compute": version,
                "Graphics": version,
                "MPSCompute": version,
            }
            assert probe.listed_pids() == {os.getpid(), os.getppid()}
            assert probe.sample({1}) == (None, "unavailable")
        finally:
            probe.close()


def test_the_unsuffixed_pynvml_query_is_not_v1(libs: dict[str, Path]) -> None:
    """Why runners.nvml calls the v1 C symbol itself: pynvml's plain name needs _v3."""
    with load_fake_libnvml(libs["v1"]) as pynvml:
        probe = GpuProbe.open(pynvml)
        assert probe is not None
        try:
            with pytest.raises(pynvml.NVMLLibraryMismatchError):
                pynvml.nvmlDeviceGetComputeRunningProcesses(probe.handles[0])
            assert probe.sample({os.getpid()}) == (300 * MiB, "process")
        finally:
            probe.close()


@pytest.mark.parametrize("newest", ["v3", "v1"])
def test_not_available_is_unknown_not_zero(
    libs: dict[str, Path], newest: str, unknown: None
) -> None:
    with load_fake_libnvml(libs[newest]) as pynvml:
        probe = GpuProbe.open(pynvml)
        assert probe is not None
        try:
            assert probe.process_memory({os.getpid()}) == (None, True)
            assert probe.sample({os.getpid()}) == (None, "unavailable")
        finally:
            probe.close()
        held = GpuProbe.open(pynvml, exclusive=True, devices="0")
        assert held is not None
        try:
            # Held alone: the device's used memory (every live publisher) stands in.
            assert held.sample({os.getpid()}) == (400 * MiB, "device")
        finally:
            held.close()


@pytest.mark.skipif(not can_unshare_pid(), reason="needs root and unshare(1)")
def test_processes_of_a_pid_namespace_are_listed_under_their_host_pids(
    tmp_path: Path,
) -> None:
    """As a real driver does: pid 1 and pid 2 of a trial's namespace are not the host's 1
    and 2 (init and kthreadd here), and a namespace that ended lists nothing."""
    library = build_fake_libnvml(tmp_path / "lib", tmp_path)
    with load_fake_libnvml(library) as pynvml:
        probe = GpuProbe.open(pynvml)
        assert probe is not None
        try:
            with published_from_a_pid_namespace(tmp_path, (30, 70)) as host:
                assert 1 not in host and 2 not in host
                assert probe.listed_pids() == set(host)
                for pid, mib in host.items():
                    assert probe.sample({pid}) == (mib * MiB, "process")
                assert probe.sample({1, 2}) == (None, "unavailable")
            assert len(list(tmp_path.glob("*.[12]"))) == 2  # left behind by the dead
            assert probe.listed_pids() == set()
        finally:
            probe.close()


def test_describe_through_pynvml(libs: dict[str, Path]) -> None:
    with load_fake_libnvml(libs["v3"]) as pynvml:
        probe = GpuProbe.open(
            pynvml, exclusive=True, devices="GPU-fa4e0000-0000-0000-0000-000000000000"
        )
        assert probe is not None
        with probe:
            d = probe.describe()
    assert d == {
        "available": True,
        "count": 1,
        "name": "FAKE NVML device",
        "memory_total": 4096 * MiB,
        "driver_version": "999.99.99-FAKE",
        "nvml_version": "12.999.99-FAKE",
        "cuda_driver_version": "12.4",
        "exclusive_devices": [0],
        "devices": [
            {
                "index": 0,
                "name": "FAKE NVML device",
                "uuid": "GPU-fa4e0000-0000-0000-0000-000000000000",
                "memory_total": 4096 * MiB,
            }
        ],
    }
