"""GPU trials in containers, with the FAKE NVML (tests/fake_nvml.py; no GPU here).

The engine here has no NVIDIA runtime, so the client is wrapped: it records the
``device_requests`` a GPU trial's run container asks for, then creates the container
without them. The fake NVML device lists every process of the running trial containers
(read from their cgroups, host PIDs, as a real driver would report them), so the GPU
series comes from matching the container's host PIDs ("process").
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from typing import Any

import pytest
from docker.types import DeviceRequest

from contract.wire import EnvSpec, TrialSpec
from runners.docker.cgroup import DEFAULT_ROOT, find
from runners.docker.executor import DockerExecutor
from runners.docker.spec import DockerSettings
from runners.nvml import GpuProbe
from tests.docker_util import RUNNER_IMAGE, engine
from tests.fake_nvml import FakeDevice, FakeNvml, FakeProcess

pytestmark = pytest.mark.docker
UUID = "GPU-11111111-fake-2222-3333-444444444444"
PER_PROCESS = 50 << 20


@dataclass
class ContainerPidsDevice(FakeDevice):
    """A fake GPU on which every process of the watched containers holds 50 MiB."""

    containers: list[str] | None = None

    def compute_processes(self) -> list[FakeProcess]:
        pids: list[int] = []
        for cid in self.containers or []:
            cg = find(cid, DEFAULT_ROOT)
            pids += cg.pids() if cg else []
        return [FakeProcess(pid, PER_PROCESS) for pid in pids]


class RecordingContainers:
    def __init__(self, real: Any, device: ContainerPidsDevice) -> None:
        self.real, self.device, self.requests = real, device, []  # type: ignore[var-annotated]

    def create(self, **kwargs: Any) -> Any:
        self.requests.append(kwargs.pop("device_requests", None))
        container = self.real.create(**kwargs)
        self.device.containers = [container.id]
        return container

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class RecordingClient:
    def __init__(self, real: Any, device: ContainerPidsDevice) -> None:
        self.real = real
        self.containers = RecordingContainers(real.containers, device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_gpu_trial_gets_exactly_its_gpu_and_a_series_by_host_pid(fixture_index: str) -> None:
    client = engine()
    device = ContainerPidsDevice(uuid=UUID)
    probe = GpuProbe.open(FakeNvml([device]))
    assert probe is not None
    recording = RecordingClient(client, device)
    settings = DockerSettings(image=RUNNER_IMAGE, runner_name=f"gpu-{os.getpid()}",
                              cache_volume="leakbisect-test-cache")  # fmt: skip
    executor = DockerExecutor(recording, settings, probe)
    script = textwrap.dedent("""
        import subprocess, time
        child = subprocess.Popen(["sleep", "3"])  # a second process in the container
        time.sleep(2)
    """)
    env = EnvSpec(package="leakyfixture", version="1.0.0", index_url=fixture_index)
    spec = TrialSpec(trial_id=1, env=env, script=script, requires_gpu=True)
    report = executor.run_trial(spec)
    assert report.exit_code == 0, report.log_tail
    assert recording.containers.requests == [
        [DeviceRequest(device_ids=[UUID], capabilities=[["gpu", "compute", "utility"]])]
    ]
    assert report.gpu_source == "process"
    gpus = [s.gpu for s in report.samples if s.gpu is not None]
    # The entry, the script and its child: three host PIDs matched at some point.
    assert max(gpus) >= 3 * PER_PROCESS
    assert all(g % PER_PROCESS == 0 for g in gpus)
    executor.remove_leftovers()
    assert executor.leftovers() == []


def test_a_cpu_trial_on_a_gpu_runner_gets_no_gpu(fixture_index: str) -> None:
    client = engine()
    device = ContainerPidsDevice(uuid=UUID)
    probe = GpuProbe.open(FakeNvml([device]))
    recording = RecordingClient(client, device)
    settings = DockerSettings(image=RUNNER_IMAGE, runner_name=f"cpu-{os.getpid()}",
                              cache_volume="leakbisect-test-cache")  # fmt: skip
    executor = DockerExecutor(recording, settings, probe)
    env = EnvSpec(package="leakyfixture", version="1.0.0", index_url=fixture_index)
    report = executor.run_trial(TrialSpec(trial_id=2, env=env, script="pass\n"))
    assert report.exit_code == 0, report.log_tail
    assert recording.containers.requests == [None]
