"""The GPU repro script, the pinned-memory probe and the gpuleakfixture releases.

The script runs as a real child process against the FAKE CUDA driver (tests/fake_cuda.c,
compiled here with gcc): there is no GPU on these machines.
"""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from service.example.gpu.fixture import GpuFixtureSpec, build_gpu_fixture, module_source
from tests.fake_cuda import FakeCuda, build_fake_cuda

REPO = Path(__file__).resolve().parents[1]
REPRO = REPO / "service" / "example" / "gpu" / "repro.py"
MARKER = "::leakbisect-step::"
KNOWN = "device-leak, device-plateau, pinned-leak, pinned-reuse, oom"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> FakeCuda:
    return build_fake_cuda(tmp_path_factory.mktemp("fake-cuda"), total_mib=4096, context_mib=64)


def repro(fake: FakeCuda | None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the repro to its end; ``args`` of the answer is the child's pid."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LEAKBISECT_")}
    extra = fake.env() if fake is not None else {}
    with subprocess.Popen(
        [sys.executable, str(REPRO)],
        env={**base, "LEAKBISECT_GPU_PAUSE": "0.001", **extra, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.pid, proc.returncode, out, err)


def test_device_leak_prints_a_marker_per_step_and_cleans_up(fake: FakeCuda) -> None:
    proc = repro(fake, LEAKBISECT_GPU_VARIANT="device-leak", LEAKBISECT_GPU_STEPS="12")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "device 0: FAKE CUDA device, 4096 MiB; variants: device-leak"
    assert lines[1:] == [MARKER] * 12
    # cuCtxDestroy_v2 withdrew the published usage; a crashed run leaves it behind.
    assert not fake.usage_file(proc.args).exists()
    crashed = repro(fake, LEAKBISECT_GPU_VARIANT="oom")
    assert crashed.returncode == 1
    assert fake.usage_file(crashed.args).read_text() == f"{4096 * 2**20}\n"


def test_two_variants_run_together(fake: FakeCuda) -> None:
    proc = repro(fake, LEAKBISECT_GPU_VARIANT="device-plateau,pinned-reuse")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].endswith("variants: device-plateau, pinned-reuse")
    assert proc.stdout.count(MARKER) == 40


def test_oom_ends_in_cuda_out_of_memory(fake: FakeCuda) -> None:
    # Chunks of 4096/48 -> 84 MiB: the context's 64 MiB + 48 chunks fill 4096 MiB exactly.
    proc = repro(fake, LEAKBISECT_GPU_VARIANT="oom")
    assert proc.returncode == 1
    assert proc.stderr == "error: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2) at step 49\n"
    assert proc.stdout.count(MARKER) == 49


def test_no_driver_is_cannot_test(tmp_path: Path) -> None:
    missing = tmp_path / "libcuda.so.1"
    proc = repro(None, LEAKBISECT_GPU_VARIANT="device-leak", LEAKBISECT_CUDA_LIBRARY=str(missing))
    assert proc.returncode == 125
    assert proc.stderr.startswith(f"cannot test: cannot load the CUDA driver {missing}: ")
    assert proc.stdout.count(MARKER) == 0


def test_not_a_cuda_driver_is_cannot_test() -> None:
    libc = "libc.so.6"
    proc = repro(None, LEAKBISECT_GPU_VARIANT="device-leak", LEAKBISECT_CUDA_LIBRARY=libc)
    assert proc.returncode == 125
    assert proc.stderr == "cannot test: libc.so.6 is not a CUDA driver: it has no cuInit\n"


def test_no_device_is_cannot_test(fake: FakeCuda) -> None:
    proc = repro(fake, LEAKBISECT_GPU_VARIANT="device-leak", LEAKBISECT_FAKE_CUDA_FAIL="cuInit=100")
    assert proc.returncode == 125
    assert proc.stderr == (
        "cannot test: the CUDA driver finds no device (cuInit failed: CUDA_ERROR_NO_DEVICE (100))\n"
    )


@pytest.mark.parametrize(
    ("symbol", "code", "name"),
    [
        ("cuCtxCreate_v2", 201, "CUDA_ERROR_INVALID_CONTEXT"),
        ("cuDeviceGet", 101, "CUDA_ERROR_INVALID_DEVICE"),
        ("cuInit", 3, "CUDA_ERROR_NOT_INITIALIZED"),
    ],
)
def test_a_failing_call_is_named_and_exits_1(
    fake: FakeCuda, symbol: str, code: int, name: str
) -> None:
    proc = repro(
        fake, LEAKBISECT_GPU_VARIANT="pinned-leak", LEAKBISECT_FAKE_CUDA_FAIL=f"{symbol}={code}"
    )
    assert proc.returncode == 1
    assert proc.stderr == f"error: {symbol} failed: {name} ({code})\n"


def test_failure_during_a_step_names_the_step(fake: FakeCuda) -> None:
    proc = repro(
        fake, LEAKBISECT_GPU_VARIANT="pinned-leak", LEAKBISECT_FAKE_CUDA_FAIL="cuMemHostAlloc=2"
    )
    assert proc.returncode == 1
    assert proc.stderr == "error: cuMemHostAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2) at step 1\n"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, f"error: no variant: set LEAKBISECT_GPU_VARIANT to one or more of {KNOWN}"),
        (
            {"LEAKBISECT_GPU_VARIANT": "device-leak,nope"},
            f"error: LEAKBISECT_GPU_VARIANT: unknown variant 'nope'; known: {KNOWN}",
        ),
        (
            {"LEAKBISECT_GPU_VARIANT": "oom", "LEAKBISECT_GPU_STEPS": "ten"},
            "error: LEAKBISECT_GPU_STEPS: 'ten' is not a positive int",
        ),
        (
            {"LEAKBISECT_GPU_VARIANT": "oom", "LEAKBISECT_GPU_PAUSE": "-1"},
            "error: LEAKBISECT_GPU_PAUSE: '-1' is not a positive float",
        ),
    ],
)
def test_bad_settings_exit_2(fake: FakeCuda, env: dict[str, str], message: str) -> None:
    proc = repro(fake, **env)
    assert proc.returncode == 2
    assert proc.stderr == message + "\n"


def test_pinned_probe_reports_shared_pages(fake: FakeCuda) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service.example.gpu.pinned_probe", "--mib", "64"],
        cwd=REPO,
        env={**os.environ, **fake.env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    kib = 64 * 1024
    assert report["device"] == "FAKE CUDA device" and report["pinned_mib"] == 64
    # The FAKE backs pinned memory with shared anonymous pages: shmem, not anon.
    assert report["status"]["delta"]["RssShmem"] == kib
    assert report["psutil"]["delta"]["shared"] == kib
    assert report["mappings"]["/dev/zero"] == {"Size": kib, "Rss": kib}
    assert report["status"]["delta"]["VmPin"] == 0


def test_pinned_probe_without_driver(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service.example.gpu.pinned_probe"],
        cwd=REPO,
        env={**os.environ, "LEAKBISECT_CUDA_LIBRARY": str(tmp_path / "none.so")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 125
    assert proc.stderr.startswith("cannot test: cannot load the CUDA driver ")


# ------------------------------------------------------------------------- the releases


def test_releases_switch_variants_at_the_first_leaking_one(tmp_path: Path) -> None:
    spec = GpuFixtureSpec(cuda_library="/opt/fake/libcuda.so")
    wheels = build_gpu_fixture(tmp_path, spec)
    names = sorted(p.name for p in wheels.iterdir())
    assert names == [f"gpuleakfixture-0.1.{i}-py3-none-any.whl" for i in range(8)] + ["index.json"]
    index = json.loads((wheels / "index.json").read_text())["files"]
    assert index["gpuleakfixture-0.1.5-py3-none-any.whl"] == {
        "requires_python": ">=3.8",
        "yanked": False,
        "upload_time": "2024-03-06T00:00:00.000000Z",
    }
    variants = {}
    for i in range(8):
        with zipfile.ZipFile(wheels / f"gpuleakfixture-0.1.{i}-py3-none-any.whl") as zf:
            namespace: dict[str, object] = {}
            exec(zf.read("gpuleakfixture/__init__.py").decode(), namespace)
        variants[namespace["__version__"]] = namespace["VARIANTS"]
        assert namespace["CUDA_LIBRARY"] == "/opt/fake/libcuda.so"
    good, bad = ("device-plateau", "pinned-reuse"), ("device-leak", "pinned-leak")
    assert variants == {f"0.1.{i}": good if i < 5 else bad for i in range(8)}


def test_default_release_uses_the_real_driver() -> None:
    source = module_source(GpuFixtureSpec(), "0.1.0")
    assert "CUDA_LIBRARY = None\n" in source


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"good": ("device-plateau", "gpu-magic")}, "good: 'gpu-magic' is not a list of variants"),
        ({"bad": ()}, "bad: 'empty' is not a list of variants"),
        ({"first_leaking": "9.9"}, "first_leaking: 9.9 is not one of the versions"),
    ],
)
def test_bad_spec_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        GpuFixtureSpec(**fields)  # type: ignore[arg-type]
