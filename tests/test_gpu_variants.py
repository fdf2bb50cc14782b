"""Each GPU repro variant judged right: the real executor, sampler and classifier.

The script runs as a real capped, sampled child process; its "GPU" is the FAKE CUDA
driver (tests/fake_cuda.c) and the GPU series comes from `GpuProbe` over the FAKE NVML in
published mode (tests/fake_nvml.py), which reports the per-process device memory the FAKE
driver publishes. Pinned host memory is real shared pages, so the host series is real.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.analysis import RunAnalysis, classify_run
from engine.verdicts import Verdict
from runners.envs import find_python
from runners.executor import Execution, run_script
from runners.nvml import GpuProbe
from tests.fake_cuda import FakeCuda, build_fake_cuda
from tests.fake_nvml import FakeNvml

REPRO = Path(__file__).resolve().parents[1] / "service" / "example" / "gpu" / "repro.py"
MiB = 2**20
CONTEXT = 64 * MiB


@pytest.fixture(scope="module")
def fake(reachable_dir: Callable[[str], Path]) -> FakeCuda:
    # The script runs as the trial user when the tests run as root: it must load the library.
    return build_fake_cuda(reachable_dir("fake-cuda"), total_mib=4096, context_mib=64)


@dataclass
class Run:
    ex: Execution
    r: RunAnalysis

    def gpu_values(self) -> list[int]:
        return [s.gpu for s in self.ex.samples if s.gpu is not None]

    def shared_growth(self) -> int:
        shared = [s.shared for s in self.ex.samples if s.shared is not None]
        return max(shared) - shared[0]

    def spike_height(self) -> int:
        """How far shared memory rose above where it fell back to after its peak."""
        shared = [s.shared for s in self.ex.samples if s.shared is not None]
        peak = shared.index(max(shared))
        return shared[peak] - min(shared[peak:])


def run_variant(
    fake: FakeCuda,
    work: Path,
    variant: str,
    *,
    exclusive: bool = False,
    unknown: bool = False,
    pause_s: float | None = None,
) -> Run:
    nvml = FakeNvml.published(fake.usage_dir, total=fake.total_mib * MiB, unknown=unknown)
    probe = GpuProbe.open(nvml, exclusive=exclusive, devices="0")
    assert probe is not None
    extra = {"LEAKBISECT_GPU_PAUSE": str(pause_s)} if pause_s is not None else {}
    env = {**os.environ, **fake.env(LEAKBISECT_GPU_VARIANT=variant, **extra)}
    ex = run_script(
        find_python(None),
        REPRO,
        cwd=work,
        timeout_s=120,
        memory_limit_bytes=2 * 2**30,
        env=env,
        gpu=probe,
    )
    gpu = [s.gpu for s in ex.samples] if ex.gpu_source != "unavailable" else None
    r = classify_run(
        [s.t for s in ex.samples],
        [s.rss for s in ex.samples],
        gpu,
        ex.steps,
        exit_code=ex.exit_code,
        oom_killed=ex.oom_killed,
        timed_out=ex.timed_out,
    )
    return Run(ex, r)


def test_device_leak_is_a_leak_of_the_gpu_series(fake: FakeCuda, trial_dir: Path) -> None:
    run = run_variant(fake, trial_dir, "device-leak")
    assert run.ex.exit_code == 0 and run.ex.gpu_source == "process"
    assert run.r.verdict is Verdict.LEAK
    assert run.r.gpu is not None and run.r.gpu.verdict is Verdict.LEAK
    assert run.r.host.verdict is Verdict.CLEAN
    assert run.r.reason.startswith("gpu leak: floor rises 1")
    # 40 steps of 16 MiB on top of the context, all seen per process.
    assert max(run.gpu_values()) == CONTEXT + 40 * 16 * MiB
    assert 500 < run.r.gpu.growth_mib < 700


def test_device_plateau_is_never_a_leak(fake: FakeCuda, trial_dir: Path) -> None:
    run = run_variant(fake, trial_dir, "device-plateau")
    assert run.ex.exit_code == 0
    assert run.r.verdict in (Verdict.CLEAN, Verdict.PLATEAU)
    assert run.r.gpu is not None and run.r.gpu.verdict in (Verdict.CLEAN, Verdict.PLATEAU)
    # The pool stops at 8 blocks of 16 MiB.
    assert max(run.gpu_values()) == CONTEXT + 8 * 16 * MiB


def test_pinned_leak_is_a_host_leak_in_shared_memory(fake: FakeCuda, trial_dir: Path) -> None:
    # Pinning and touching 8 MiB a step is slow under load: at the default 50 ms a step a
    # loaded machine sampled only 92 times, too few per block to judge (inconclusive).
    # Three times the pause gives every block its samples; the verdict is per step anyway.
    run = run_variant(fake, trial_dir, "pinned-leak", pause_s=0.15)
    assert run.ex.exit_code == 0
    assert run.r.verdict is Verdict.LEAK
    assert run.r.host.verdict is Verdict.LEAK
    assert run.r.reason.startswith("host leak: floor rises ")
    # 8 MiB pinned per step; which sample a step marker lands on wobbles under load.
    assert run.r.host.slope is not None and 7.0 < run.r.host.slope < 9.0
    # Device memory flat at the context's, while shared host memory grew by the pinned pages.
    assert run.r.gpu is not None and run.r.gpu.verdict is Verdict.CLEAN
    assert set(run.gpu_values()) == {CONTEXT}
    assert run.shared_growth() >= 39 * 8 * MiB
    last = run.ex.samples[-3]
    assert last.shared is not None and last.anon is not None and last.shared > last.anon


def test_pinned_reuse_with_spikes_is_not_a_leak(fake: FakeCuda, trial_dir: Path) -> None:
    run = run_variant(fake, trial_dir, "pinned-reuse")
    assert run.ex.exit_code == 0
    assert run.r.verdict in (Verdict.CLEAN, Verdict.PLATEAU)
    assert run.r.host.verdict in (Verdict.CLEAN, Verdict.PLATEAU)
    # The 64 MiB checkpoint spikes were really there, in shared memory, and were freed. (Not
    # measured from the first sample: how much of the two 8 MiB buffers that one already
    # holds depends on how soon the script starts.)
    assert run.spike_height() >= 64 * MiB


def test_oom_ending_is_a_leak(fake: FakeCuda, trial_dir: Path) -> None:
    run = run_variant(fake, trial_dir, "oom")
    assert run.ex.exit_code == 1
    assert "CUDA_ERROR_OUT_OF_MEMORY (2) at step 49" in run.ex.log_tail
    assert run.r.verdict is Verdict.LEAK
    assert run.r.reason.startswith("crashed (exit 1) while leaking, likely out of memory; gpu: ")
    assert max(run.gpu_values()) == 4096 * MiB


def test_device_level_series_when_held_alone(fake: FakeCuda, trial_dir: Path) -> None:
    """NVML lists the pid without a figure: the exclusively held device's memory stands in."""
    run = run_variant(fake, trial_dir, "device-leak", exclusive=True, unknown=True)
    assert run.ex.gpu_source == "device"
    assert run.r.verdict is Verdict.LEAK and run.r.gpu is not None
    assert run.r.gpu.verdict is Verdict.LEAK


def test_unknown_per_process_memory_without_exclusivity_is_unavailable(
    fake: FakeCuda, trial_dir: Path
) -> None:
    """None means unknown, never zero: no GPU series at all, so the leak cannot be seen."""
    run = run_variant(fake, trial_dir, "device-leak", unknown=True)
    assert run.ex.gpu_source == "unavailable"
    assert run.gpu_values() == []
    assert run.r.gpu is None
    assert run.r.verdict is Verdict.CLEAN
