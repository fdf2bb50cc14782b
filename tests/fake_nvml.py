"""FAKE NVML for tests: a stand-in for the `pynvml` module. NOT a GPU.

There is no GPU (and no libnvidia-ml) on the development machines, so the
tests of `runners.nvml.GpuProbe` pass an instance of `FakeNvml` where the real
code passes the `pynvml` module. It implements only the calls GpuProbe makes,
with pynvml's names and conventions:

* errors are `FakeNvml.NVMLError` instances carrying ``.value`` (an
  ``NVML_ERROR_*`` code), as pynvml raises them;
* a query the "driver" lacks raises ``NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)``,
  which is what pynvml does when the symbol is missing from libnvidia-ml
  (list such names in ``missing``);
* the process queries exist as ``..._v3`` and ``..._v2`` (pynvml's names) and
  ``..._v1`` (pynvml has no such name: it stands for the unsuffixed C symbol,
  which `runners.nvml` calls through pynvml's function-pointer lookup); the
  unsuffixed Python name behaves as pynvml's does: it calls ``_v3`` and raises
  `FakeLibraryMismatchError` (not an NVMLError) when ``_v3`` is missing;
* process entries have ``pid`` and ``usedGpuMemory`` (None = not available);
* ``init_error`` makes ``nvmlInit`` fail (e.g. LIBRARY_NOT_FOUND: no driver).

Every call is appended to ``calls`` so tests can see which variant was used.

Published mode (`FakeNvml.published`): device 0 stands for the FAKE CUDA driver
(tests/fake_cuda.c), which writes each process's "device" usage to
``<usage_dir>/<nsino>.<nspid>``: the inode of the process's PID namespace and its
pid there (a trial's script is pid 2 of a namespace of its own: runners/shim.py).
Its compute-process list is then read from that directory at every query and its
used memory is their sum. Like a real driver, which reports host pids whatever
namespace a process is in, each file is listed under the publisher's pid in this
process's /proc (`host_pid`); files nobody alive resolves to, and files older than
their process's start (left by a dead process whose namespace inode and pid were
reused), are ignored. So `GpuProbe` sees the per-process memory of a trial's host
pids as on a real GPU.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace


class FakeNVMLError(Exception):
    """Like pynvml.NVMLError: carries the NVML return code in ``value``."""

    def __init__(self, value: int):
        super().__init__(f"fake NVML error {value}")
        self.value = value


class FakeLibraryMismatchError(Exception):
    """Like pynvml.NVMLLibraryMismatchError: an unversioned query whose _v3 is missing."""


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - pynvml's field name


@dataclass
class FakeDevice:
    name: str = "Fake GPU 80GB"
    uuid: str = "GPU-00000000-fake-0000-0000-000000000000"
    total: int = 80 * 2**30
    used: int = 0
    compute: list[FakeProcess] = field(default_factory=list)
    graphics: list[FakeProcess] = field(default_factory=list)
    mps: list[FakeProcess] = field(default_factory=list)
    # Published mode: compute processes and used memory come from this directory.
    published_dir: Path | None = None
    # Published mode: list the processes with usedGpuMemory None (NVML_VALUE_NOT_AVAILABLE).
    published_unknown: bool = False

    def compute_processes(self) -> list[FakeProcess]:
        if self.published_dir is None:
            return list(self.compute)
        published = read_published(self.published_dir)
        if self.published_unknown:
            published = [FakeProcess(p.pid, None) for p in published]
        return list(self.compute) + published

    def used_bytes(self) -> int:
        if self.published_dir is None:
            return self.used
        return self.used + sum(p.usedGpuMemory or 0 for p in read_published(self.published_dir))


def parse_usage_name(name: str) -> tuple[int, int] | None:
    """``"<nsino>.<nspid>"`` (a FAKE CUDA usage file's name) -> (nsino, nspid); else None."""
    ino, dot, pid = name.partition(".")
    if not (dot and ino.isdigit() and pid.isdigit() and int(ino) > 0 and int(pid) > 0):
        return None
    return int(ino), int(pid)


def _ns_inode(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _nspid(pid: int | str) -> list[int]:
    """The ``NSpid:`` fields of /proc/PID/status: this /proc's pid first, the process's
    own namespace's last; [] when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


STALE_SLACK_S = 0.05  # two clock ticks and the uptime's rounding


def start_time(pid: int) -> float:
    """When host process `pid` started, in seconds since the epoch, to a clock tick: boot
    time as now less /proc/uptime (psutil's create_time uses /proc/stat's whole-second
    btime, and a usage file a dead trial wrote a few hundred milliseconds before the next
    trial with the same namespace inode and pid 2 started must still read as older)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    boot = time.time() - uptime
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime


def host_pid(ns_inode: int, ns_pid: int) -> int | None:
    """The pid in this process's /proc of process `ns_pid` of the PID namespace whose
    inode is `ns_inode`, as a real driver reports it; None when no such process lives.

    Fast path: /proc/<ns_pid> is that process (no namespace). Else a scan of /proc for a
    process of that namespace whose NSpid ends with `ns_pid`: its first NSpid field.
    """
    if _ns_inode(ns_pid) == ns_inode and _nspid(ns_pid)[-1:] == [ns_pid]:
        return ns_pid
    for name in os.listdir("/proc"):
        if name.isdigit() and _ns_inode(name) == ns_inode:
            fields = _nspid(name)
            if fields[-1:] == [ns_pid]:
                return fields[0]
    return None


def read_published(usage_dir: Path) -> list[FakeProcess]:
    """The live processes that published FAKE CUDA usage in ``usage_dir``, under their
    pids in this process's /proc."""
    out = []
    for entry in os.scandir(usage_dir):
        identity = parse_usage_name(entry.name)
        if identity is None:
            continue  # a write in progress (.<nsino>.<nspid>.tmp), a stray file
        pid = host_pid(*identity)
        if pid is None:
            continue  # gone
        try:
            os.kill(pid, 0)
        except PermissionError:
            pass  # alive, another user's
        except OSError:
            continue
        try:
            started = start_time(pid)
            stat = entry.stat()
            used = int(Path(entry.path).read_text())
        except (OSError, ValueError):
            continue  # gone, or written by nobody alive
        if stat.st_mtime + STALE_SLACK_S < started:
            continue  # left by a dead process whose namespace inode and pid were reused
        out.append(FakeProcess(pid, used))
    return sorted(out, key=lambda p: p.pid)


class FakeNvml:
    """A FAKE of the pynvml module's surface used by GpuProbe (see the module docstring)."""

    NVMLError = FakeNVMLError
    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13

    def __init__(
        self,
        devices: list[FakeDevice] | None = None,
        *,
        missing: set[str] | frozenset[str] = frozenset(),
        init_error: int | None = None,
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,
    ):
        self.devices = devices if devices is not None else [FakeDevice()]
        self.missing = set(missing)
        self.init_error = init_error
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.calls: list[str] = []
        self.initialized = False
        for kind, attr in (("Compute", "compute"), ("Graphics", "graphics"), ("MPSCompute", "mps")):
            for variant in ("_v3", "_v2", "_v1"):
                name = f"nvmlDeviceGet{kind}RunningProcesses{variant}"
                setattr(self, name, self._process_query(name, attr))
            plain = f"nvmlDeviceGet{kind}RunningProcesses"
            setattr(self, plain, self._unversioned(plain))

    @classmethod
    def published(
        cls,
        usage_dir: Path,
        *,
        total: int,
        unknown: bool = False,
        name: str = "FAKE GPU (published usage)",
        **kw: object,
    ) -> FakeNvml:
        """One device whose compute processes are what the FAKE CUDA driver publishes.

        ``unknown``: list them with ``usedGpuMemory`` None, as NVML does where it cannot
        tell (the device's used memory still counts them).
        """
        device = FakeDevice(
            name=name, total=total, published_dir=Path(usage_dir), published_unknown=unknown
        )
        return cls([device], **kw)  # type: ignore[arg-type]

    # -- helpers

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.missing:
            raise FakeNVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        if name != "nvmlInit" and not self.initialized:
            raise FakeNVMLError(1)  # NVML_ERROR_UNINITIALIZED

    def _process_query(self, name: str, attr: str):
        def query(handle: int) -> list[FakeProcess]:
            self._call(name)
            device = self.devices[handle]
            if attr == "compute":
                return device.compute_processes()
            return list(getattr(device, attr))

        query.__name__ = name
        return query

    def _unversioned(self, name: str):
        # pynvml >= 11.515: the unsuffixed function is a wrapper of _v3, not the v1 query.
        def query(handle: int) -> list[FakeProcess]:
            self.calls.append(name)
            try:
                return getattr(self, name + "_v3")(handle)
            except FakeNVMLError as e:
                if e.value != self.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                raise FakeLibraryMismatchError(f"{name}: use a versioned function") from e

        query.__name__ = name
        return query

    # -- the NVML calls

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._call("nvmlInit")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        self._call("nvmlDeviceGetHandleByIndex")
        return i  # the fake's handle is the index

    def nvmlDeviceGetName(self, h: int) -> str:  # noqa: N802
        self._call("nvmlDeviceGetName")
        return self.devices[h].name

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        self._call("nvmlDeviceGetUUID")
        return self.devices[h].uuid

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        self._call("nvmlDeviceGetMemoryInfo")
        d = self.devices[h]
        used = d.used_bytes()
        return SimpleNamespace(total=d.total, used=used, free=d.total - used)

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._call("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802
        self._call("nvmlSystemGetNVMLVersion")
        return "12." + self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._call("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version
