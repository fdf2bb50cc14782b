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

A process publishes in ``<usage_dir>/<nsino>.<nspid>``: its PID namespace's inode and its
pid there (a trial's script is pid 2 of a namespace of its own), which the FAKE NVMLs
resolve to the host pid, as a real driver reports it. `usage_name` names the file of a
process in this process's PID namespace (`FakeCuda.usage_file`).

`build_fake_libnvml` compiles tests/fake_libnvml.c, a FAKE ``libnvidia-ml.so.1`` that
reports the same published usage, so the *real* pynvml module can be pointed at it
(``LD_LIBRARY_PATH`` for a child process, or `load_fake_libnvml` in this one) and its
ctypes marshalling is exercised together with `runners.nvml`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
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

    def usage_file(self, pid: int) -> Path:
        """Where process `pid` of this process's PID namespace publishes its usage."""
        return self.usage_dir / usage_name(pid)


def usage_name(pid: int, ns_inode: int | None = None) -> str:
    """The usage file name of process `pid` of the PID namespace whose inode is `ns_inode`
    (default: this process's namespace, whose pids ``os.getpid()`` and ``Popen.pid`` are)."""
    if ns_inode is None:
        ns_inode = os.stat("/proc/self/ns/pid").st_ino
    return f"{ns_inode}.{pid}"


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
    # World-writable: a trial runs as a trial uid of its own when the runner is root, and
    # the FAKE driver publishes its usage file from inside the trial. Not sticky: every
    # trial is pid 2 of a PID namespace whose inode the kernel reuses, so a later trial
    # (another slot user) must be able to replace the file a killed one left at its name.
    usage.chmod(0o777)
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


# Pid 1 of a new PID namespace (its own /proc mounted, as a trial's) publishes argv[2] MiB
# and forks pid 2, which publishes argv[3] MiB, both named as the FAKE driver names them;
# "ready", then both wait for stdin to close.
_NAMESPACED_PUBLISHERS = """
import os, sys
usage, mib = sys.argv[1], sys.argv[2:]
def publish(n):
    ino = os.stat("/proc/self/ns/pid").st_ino
    with open(f"{usage}/{ino}.{os.getpid()}", "w") as f:
        f.write(f"{int(n) * 2**20}\\n")
publish(mib[0])
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    publish(mib[1])
    os.close(w)
    sys.stdin.read()
    os._exit(0)
os.close(w)
os.read(r, 1)
print("ready", os.getpid(), flush=True)
sys.stdin.read()
os.wait()
"""


@contextmanager
def published_from_a_pid_namespace(
    usage_dir: Path, mib: tuple[int, int]
) -> Iterator[dict[int, int]]:
    """Pid 1 and pid 2 of a new PID namespace publish ``mib[0]`` and ``mib[1]`` MiB in
    ``usage_dir`` as the FAKE driver names them; yields {host pid: MiB} while they live.

    Needs root and util-linux ``unshare`` (the caller skips otherwise: `can_unshare_pid`).
    """
    import psutil

    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
         _NAMESPACED_PUBLISHERS, str(usage_dir), *map(str, mib)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().split() == ["ready", "1"]
        host = {}
        for child in psutil.Process(proc.pid).children(recursive=True):
            with open(f"/proc/{child.pid}/status") as f:
                nspid = next(ln.split()[1:] for ln in f if ln.startswith("NSpid:"))
            if len(nspid) == 2:
                host[int(nspid[1])] = child.pid
        assert set(host) == {1, 2}, host
        yield {host[1]: mib[0], host[2]: mib[1]}
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def can_unshare_pid() -> bool:
    """Whether this process may start a PID namespace with its own /proc (root, unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0
