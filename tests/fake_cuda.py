"""FAKE CUDA driver for tests: builds tests/fake_cuda.c into a shared library. NOT a GPU.

There is no GPU and no libcuda on the development machines. `build_fake_cuda` compiles
the FAKE driver (see tests/fake_cuda.c for what each call does) with gcc into
``dest/libfakecuda.so`` and returns a `FakeCuda` naming the library and the directory
where it publishes per-process "device" usage, which `tests.fake_nvml.FakeNvml.published`
reads. The usage directory and the device size are compiled in as defaults, so a script
finds them even when its environment is filtered; the ``LEAKBISECT_FAKE_CUDA_*``
variables override them at run time.

The fixture scripts load the library named by ``LEAKBISECT_CUDA_LIBRARY`` (default
``libcuda.so.1``); `FakeCuda.env()` gives that variable for a child's environment.

`build_fake_libnvml` compiles tests/fake_libnvml.c, a FAKE ``libnvidia-ml.so.1`` that
reports the same published usage, so the *real* pynvml module can be pointed at it
(``LD_LIBRARY_PATH`` for a child process, or `load_fake_libnvml` in this one) and its
ctypes marshalling is exercised together with `runners.nvml`.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("fake_cuda.c")
NVML_SOURCE = Path(__file__).with_name("fake_libnvml.c")
NVML_SONAME = "libnvidia-ml.so.1"
LIBRARY_ENV = "LEAKBISECT_CUDA_LIBRARY"


class FakeCudaBuildError(RuntimeError):
    """gcc is missing or the FAKE driver did not compile (the message has gcc's output)."""


@dataclass(frozen=True)
class FakeCuda:
    """A built FAKE driver: the library, where it publishes usage, its device size."""

    library: Path
    usage_dir: Path
    total_mib: int
    context_mib: int

    def env(self, **extra: str) -> dict[str, str]:
        """Variables that point a fixture script at this FAKE driver (plus ``extra``)."""
        return {LIBRARY_ENV: str(self.library), **extra}


def _compile(source: Path, library: Path, *flags: str) -> None:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise FakeCudaBuildError("no C compiler (gcc or cc) on PATH: cannot build the FAKE library")
    cmd = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library), str(source)]
    proc = subprocess.run([*cmd, *flags], capture_output=True, text=True)
    if proc.returncode != 0:
        raise FakeCudaBuildError(f"building {source.name} failed: {proc.stderr.strip()}")


def build_fake_cuda(
    dest: Path, *, total_mib: int = 4096, context_mib: int = 64, usage_dir: Path | None = None
) -> FakeCuda:
    """Compile the FAKE driver into ``dest`` (created); usage goes to ``dest/usage`` by default."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    usage = Path(usage_dir) if usage_dir is not None else dest / "usage"
    usage.mkdir(parents=True, exist_ok=True)
    # Sticky and world-writable like /tmp: a trial runs as the sandbox's trial uid when the
    # runner is root, and the FAKE driver publishes its usage file from inside the trial.
    usage.chmod(0o1777)
    library = dest / "libfakecuda.so"
    _compile(
        SOURCE, library, f'-DFAKE_USAGE_DIR="{usage}"', f"-DFAKE_TOTAL_MIB={int(total_mib)}",
        f"-DFAKE_CONTEXT_MIB={int(context_mib)}",
    )  # fmt: skip
    return FakeCuda(library, usage, int(total_mib), int(context_mib))


def build_fake_libnvml(
    dest: Path, usage_dir: Path, *, total_mib: int = 4096, versions: str = "v3"
) -> Path:
    """Compile the FAKE ``libnvidia-ml.so.1`` into ``dest`` (a directory for LD_LIBRARY_PATH).

    ``versions``: the newest process query it has: "v3" (all), "v2" (no _v3), "v1" (neither
    _v3 nor _v2, as drivers before R450). Returns the library's path.
    """
    flags = {"v3": [], "v2": ["-DFAKE_NO_V3"], "v1": ["-DFAKE_NO_V3", "-DFAKE_NO_V2"]}[versions]
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    library = dest / NVML_SONAME
    _compile(
        NVML_SOURCE, library, f"-Wl,-soname,{NVML_SONAME}", f'-DFAKE_USAGE_DIR="{usage_dir}"',
        f"-DFAKE_TOTAL_MIB={int(total_mib)}", *flags,
    )  # fmt: skip
    return library


@contextmanager
def load_fake_libnvml(library: Path) -> Iterator[ModuleType]:
    """Point the real pynvml module at a FAKE libnvidia-ml in this process, for the block.

    pynvml loads its library once into the module global ``nvmlLib`` and caches function
    pointers; both are swapped for the block and restored after it.
    """
    import pynvml

    saved = pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = ctypes.CDLL(str(library))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield pynvml
    finally:
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])
