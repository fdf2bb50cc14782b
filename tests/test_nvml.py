"""GpuProbe against FakeNvml (tests/fake_nvml.py): there is no GPU here."""

import pytest

from runners.nvml import GpuProbe, open_probe
from tests.fake_cuda import can_unshare_pid, published_from_a_pid_namespace, usage_name
from tests.fake_nvml import FakeDevice, FakeNvml, FakeProcess

GiB = 2**30
MiB = 2**20


def two_gpus() -> list[FakeDevice]:
    return [
        FakeDevice(
            name="Fake H100",
            uuid="GPU-aaaa",
            used=10 * GiB,
            compute=[FakeProcess(100, 3 * GiB), FakeProcess(999, 5 * GiB)],
        ),
        FakeDevice(
            name="Fake H100",
            uuid="GPU-bbbb",
            used=20 * GiB,
            compute=[FakeProcess(101, 1 * GiB)],
            graphics=[FakeProcess(102, 512 * MiB)],
        ),
    ]


def test_per_process_sum_across_devices_uses_v3():
    fake = FakeNvml(two_gpus())
    probe = GpuProbe.open(fake)
    assert probe is not None
    assert probe.sample({100, 101, 102}) == (3 * GiB + 1 * GiB + 512 * MiB, "process")
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in fake.calls
    assert "nvmlDeviceGetComputeRunningProcesses_v2" not in fake.calls


def test_v3_absent_falls_back_to_v2_and_remembers():
    fake = FakeNvml(
        two_gpus(),
        missing={
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
        },
    )
    probe = GpuProbe.open(fake)
    assert probe.sample({100}) == (3 * GiB, "process")
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in fake.calls
    fake.calls.clear()
    assert probe.sample({100, 102}) == (3 * GiB + 512 * MiB, "process")
    # The missing v3 is not asked again on every sample.
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in fake.calls


def test_v3_and_v2_absent_fall_back_to_v1():
    missing = {
        f"nvmlDeviceGet{k}RunningProcesses{v}"
        for k in ("Compute", "Graphics", "MPSCompute")
        for v in ("_v3", "_v2")
    }
    fake = FakeNvml(two_gpus(), missing=missing)
    probe = GpuProbe.open(fake)
    assert probe.sample({101}) == (1 * GiB, "process")
    # v1 is the unsuffixed C query; pynvml's unsuffixed Python function is a _v3 wrapper
    # (it raises a library-mismatch error here), so it must never be the fallback.
    assert "nvmlDeviceGetComputeRunningProcesses_v1" in fake.calls
    assert "nvmlDeviceGetComputeRunningProcesses" not in fake.calls
    assert probe.query_versions() == {"Compute": "_v1", "Graphics": "_v1", "MPSCompute": "_v1"}


def test_pid_in_compute_and_graphics_counted_once():
    dev = FakeDevice(compute=[FakeProcess(7, 2 * GiB)], graphics=[FakeProcess(7, 2 * GiB)])
    probe = GpuProbe.open(FakeNvml([dev]))
    assert probe.sample({7}) == (2 * GiB, "process")


def test_none_used_memory_is_unknown_not_zero():
    dev = FakeDevice(used=6 * GiB, compute=[FakeProcess(7, None), FakeProcess(8, 1 * GiB)])
    probe = GpuProbe.open(FakeNvml([dev]))
    # pid 7 matched but its figure is unknown: the sum is unknown, never 1 GiB or 0.
    assert probe.sample({7, 8}) == (None, "unavailable")
    assert probe.process_memory({7, 8}) == (None, True)
    # Exclusively held: the device figure stands in.
    excl = GpuProbe.open(FakeNvml([dev]), exclusive=True, devices="0")
    assert excl.sample({7, 8}) == (6 * GiB, "device")


def test_no_pid_match_device_level_when_exclusive(monkeypatch):
    # In a container NVML reports host pids: nothing matches.
    probe = GpuProbe.open(FakeNvml(two_gpus()))
    assert probe.sample({4242}) == (None, "unavailable")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    probe = GpuProbe.open(FakeNvml(two_gpus()), exclusive=True)
    assert probe.exclusive_indices == [1]
    assert probe.sample({4242}) == (20 * GiB, "device")

    probe = GpuProbe.open(FakeNvml(two_gpus()), exclusive=True, devices="GPU-aaaa")
    assert probe.sample({4242}) == (10 * GiB, "device")

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    probe = GpuProbe.open(FakeNvml(two_gpus()), exclusive=True)
    assert probe.sample({4242}) == (30 * GiB, "device")


def test_process_queries_unsupported_everywhere():
    missing = {
        f"nvmlDeviceGet{k}RunningProcesses{v}"
        for k in ("Compute", "Graphics", "MPSCompute")
        for v in ("_v3", "_v2", "_v1")
    }
    probe = GpuProbe.open(FakeNvml(two_gpus(), missing=missing), exclusive=True, devices="0")
    assert probe.sample({100}) == (10 * GiB, "device")


def test_other_nvml_error_is_not_remembered_as_missing():
    fake = FakeNvml([FakeDevice(compute=[FakeProcess(5, GiB)])])
    probe = GpuProbe.open(fake)

    def not_supported(handle):
        raise fake.NVMLError(fake.NVML_ERROR_NOT_SUPPORTED)

    real = fake.nvmlDeviceGetComputeRunningProcesses_v3
    fake.nvmlDeviceGetComputeRunningProcesses_v3 = not_supported
    assert probe.sample({5}) == (None, "unavailable")
    fake.nvmlDeviceGetComputeRunningProcesses_v3 = real
    assert probe.sample({5}) == (GiB, "process")


@pytest.mark.parametrize(
    "code", [FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND, FakeNvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_no_driver_is_unavailable(code):
    assert GpuProbe.open(FakeNvml(init_error=code)) is None


def test_no_devices_is_unavailable():
    fake = FakeNvml([])
    assert GpuProbe.open(fake) is None
    assert "nvmlShutdown" in fake.calls


def test_real_pynvml_on_this_machine_does_not_raise():
    # Whatever the machine has: a probe or None, never an exception.
    probe = GpuProbe.open()
    if probe is not None:
        probe.close()


def test_describe():
    fake = FakeNvml(two_gpus(), driver_version="550.54.15", cuda_driver_version=12040)
    with GpuProbe.open(fake, exclusive=True, devices="0") as probe:
        d = probe.describe()
    assert d["available"] is True
    assert d["count"] == 2
    assert d["name"] == "Fake H100"
    assert d["memory_total"] == 2 * 80 * GiB
    assert d["driver_version"] == "550.54.15"
    assert d["cuda_driver_version"] == "12.4"
    assert d["exclusive_devices"] == [0]
    assert [x["uuid"] for x in d["devices"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert "nvmlShutdown" in fake.calls


def test_closed_probe_is_unavailable():
    probe = GpuProbe.open(FakeNvml(two_gpus()))
    probe.close()
    assert probe.sample({100}) == (None, "unavailable")


def test_listed_pids():
    probe = GpuProbe.open(FakeNvml(two_gpus()))
    assert probe.listed_pids() == {100, 999, 101, 102}
    missing = {
        f"nvmlDeviceGet{k}RunningProcesses{v}"
        for k in ("Compute", "Graphics", "MPSCompute")
        for v in ("_v3", "_v2", "_v1")
    }
    assert GpuProbe.open(FakeNvml(two_gpus(), missing=missing)).listed_pids() is None
    assert GpuProbe.open(FakeNvml([FakeDevice()])).listed_pids() == set()


def test_unsuffixed_query_is_never_used():
    """pynvml's unsuffixed query wraps _v3; on a driver without _v3 it raises a non-NVML error."""
    missing = {
        f"nvmlDeviceGet{k}RunningProcesses_v3" for k in ("Compute", "Graphics", "MPSCompute")
    }
    fake = FakeNvml(two_gpus(), missing=missing)
    probe = GpuProbe.open(fake)
    assert probe.sample({100}) == (3 * GiB, "process")
    assert probe.query_versions()["Compute"] == "_v2"
    assert not [c for c in fake.calls if c.endswith("RunningProcesses")]


def test_published_mode_reads_live_pids_only(tmp_path):
    """The FAKE NVML over FAKE CUDA usage files: dead or reused pids are not listed."""
    import os
    import subprocess
    import sys
    import time

    (tmp_path / usage_name(os.getpid())).write_text(f"{300 * MiB}\n")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / usage_name(gone.pid)).write_text(f"{7 * MiB}\n")  # a process that exited
    (tmp_path / usage_name(os.getppid())).write_text(f"{5 * MiB}\n")
    old = time.time() - 10 * 365 * 86400  # older than the parent: left by an earlier pid
    os.utime(tmp_path / usage_name(os.getppid()), (old, old))
    (tmp_path / f".{usage_name(123)}.tmp").write_text("1\n")  # a write in progress
    fake = FakeNvml.published(tmp_path, total=4 * GiB)
    probe = GpuProbe.open(fake)
    assert probe.listed_pids() == {os.getpid()}
    assert probe.sample({os.getpid()}) == (300 * MiB, "process")
    assert fake.nvmlDeviceGetMemoryInfo(0).used == 300 * MiB
    unknown = GpuProbe.open(FakeNvml.published(tmp_path, total=4 * GiB, unknown=True))
    assert unknown.sample({os.getpid()}) == (None, "unavailable")


@pytest.mark.skipif(not can_unshare_pid(), reason="needs root and unshare(1)")
def test_published_mode_lists_a_pid_namespace_under_host_pids(tmp_path):
    """As a real driver does: pid 1 and pid 2 of a trial's namespace are not the host's 1
    and 2 (init and kthreadd here), and a namespace that ended lists nothing."""
    fake = FakeNvml.published(tmp_path, total=4 * GiB)
    probe = GpuProbe.open(fake)
    with published_from_a_pid_namespace(tmp_path, (30, 70)) as host:
        assert 1 not in host and 2 not in host
        assert probe.listed_pids() == set(host)
        for pid, mib in host.items():
            assert probe.sample({pid}) == (mib * MiB, "process")
        assert probe.sample({1, 2}) == (None, "unavailable")
        assert fake.nvmlDeviceGetMemoryInfo(0).used == 100 * MiB
    assert len(list(tmp_path.glob("*.[12]"))) == 2  # left behind by the dead
    assert probe.listed_pids() == set()


# open_probe: how a runner decides that its GPUs are held by its trials alone.


def idle_gpu() -> list[FakeDevice]:
    return [FakeDevice(uuid="GPU-idle", used=512 * MiB)]


def test_open_probe_auto_claims_an_idle_gpu():
    probe = open_probe("auto", FakeNvml(idle_gpu()))
    assert probe is not None and probe.exclusive_indices == [0]
    # No per-process figure for the trial: the device's memory stands in, source "device".
    assert probe.sample({4242}) == (512 * MiB, "device")


def test_open_probe_auto_leaves_a_busy_gpu_shared():
    probe = open_probe("auto", FakeNvml(two_gpus()))
    assert probe is not None and probe.exclusive_indices is None
    assert probe.sample({4242}) == (None, "unavailable")


def test_open_probe_auto_leaves_a_gpu_shared_by_several_agents():
    probe = open_probe("auto", FakeNvml(idle_gpu()), sharers=2)
    assert probe is not None and probe.exclusive_indices is None


def test_open_probe_yes_and_no_say_so_outright():
    assert open_probe("yes", FakeNvml(two_gpus())).exclusive_indices == [0, 1]
    assert open_probe("no", FakeNvml(idle_gpu())).exclusive_indices is None


def test_open_probe_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="GPU exclusive mode 'maybe': allowed are auto, yes, no"):
        open_probe("maybe", FakeNvml(idle_gpu()))
