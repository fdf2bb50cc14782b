"""GPU memory through NVML (`pynvml`, package nvidia-ml-py).

`GpuProbe.open()` returns None when there is no driver or no GPU; the trial's
GPU series is then "unavailable". Otherwise `GpuProbe.sample(pids)` answers
``(bytes, source)``:

``"process"``
    The per-process figure (``usedGpuMemory``) summed over the trial's pids on
    every device, from the compute, graphics and MPS-compute process lists.
    Each list is read with the newest query the driver has: ``..._v3``, then
    ``_v2``, then v1, the C symbol without a suffix. pynvml's own unsuffixed
    Python function is *not* v1: since nvidia-ml-py 11.515 it calls ``_v3`` (and
    raises `NVMLLibraryMismatchError`, not an NVMLError, when the driver lacks
    it), so v1 is called here through pynvml's function-pointer lookup with the
    v1 struct ``{pid, usedGpuMemory}`` (`_v1_processes`). The query that works is
    remembered per list; one the driver lacks (NVML_ERROR_FUNCTION_NOT_FOUND) is
    not asked again. ``usedGpuMemory`` of None (NVML_VALUE_NOT_AVAILABLE: WDDM,
    missing permission) means *unknown*, not zero, so a matched pid with an
    unknown figure makes the sum unknown.
``"device"``
    No usable per-process figure, but the GPU is held exclusively by the trial
    (``exclusive=True``, devices from ``CUDA_VISIBLE_DEVICES`` or ``devices``):
    ``nvmlDeviceGetMemoryInfo(handle).used`` summed over those devices. This is
    the usual case inside a container, where NVML reports host pids that do
    not match the container's.
``"unavailable"``
    Neither: the value is None.

``CUDA_VISIBLE_DEVICES`` entries are NVML indices or UUIDs (``GPU-...``); NVML
numbers devices by PCI bus id, so indices only agree with CUDA's when the
trial runs with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (UUIDs always agree). MIG
instances are not resolved; a MIG UUID entry falls back to all devices.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

_PROCESS_LISTS = ("Compute", "Graphics", "MPSCompute")
_VERSIONS = ("_v3", "_v2", "_v1")
_NVML_SUCCESS = 0
_NVML_ERROR_INSUFFICIENT_SIZE = 7
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t, what the unsuffixed C queries fill in."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _v1_processes(nvml: Any, symbol: str, handle: Any) -> list[Any]:
    """The v1 process query by its C symbol, with pynvml's two-call size protocol."""
    fn = nvml._nvmlGetFunctionPointer(symbol)  # NVMLError(FUNCTION_NOT_FOUND) when absent
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == _NVML_SUCCESS:
        return []
    if ret != _NVML_ERROR_INSUFFICIENT_SIZE:
        raise nvml.NVMLError(ret)
    count.value = count.value * 2 + 5  # room for processes that start meanwhile
    procs = (_ProcessInfoV1 * count.value)()
    ret = fn(handle, ctypes.byref(count), procs)
    if ret != _NVML_SUCCESS:
        raise nvml.NVMLError(ret)
    return [
        SimpleNamespace(
            pid=int(p.pid),
            usedGpuMemory=None if p.usedGpuMemory == _NOT_AVAILABLE else int(p.usedGpuMemory),
        )
        for p in procs[: count.value]
    ]


def _process_query(nvml: Any, kind: str, version: str) -> Callable[[Any], Any] | None:
    """The process-list query ``kind`` at ``version``; None when this binding has none."""
    name = f"nvmlDeviceGet{kind}RunningProcesses"
    fn = getattr(nvml, name + version, None)
    if fn is None and version == "_v1" and hasattr(nvml, "_nvmlGetFunctionPointer"):
        return functools.partial(_v1_processes, nvml, name)
    return fn


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class GpuProbe:
    """Reads GPU memory for a set of pids. Construct with `open()`."""

    def __init__(
        self,
        nvml: Any,
        handles: list[Any],
        *,
        exclusive_indices: list[int] | None = None,
    ):
        self.nvml = nvml
        self.handles = handles
        # Device indices the trial holds exclusively (device-level fallback); None: not exclusive.
        self.exclusive_indices = exclusive_indices
        # Process-list query version that works, per list kind ("" when none does).
        self._versions: dict[str, str | None] = {}
        self._closed = False

    @classmethod
    def open(
        cls,
        nvml: ModuleType | Any | None = None,
        *,
        exclusive: bool = False,
        devices: str | None = None,
    ) -> GpuProbe | None:
        """Initialise NVML; None when there is no library, driver or GPU.

        ``exclusive``: the trial holds its GPUs alone, so device-level memory is
        a fair figure when per-process memory is not available. ``devices`` is
        a ``CUDA_VISIBLE_DEVICES``-style list of the trial's GPUs (default: the
        environment's ``CUDA_VISIBLE_DEVICES``; unset means all devices).
        """
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]
            except ImportError:
                return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return None
        except OSError:  # a broken libnvidia-ml
            return None
        try:
            count = nvml.nvmlDeviceGetCount()
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError:
            _shutdown(nvml)
            return None
        if not handles:
            _shutdown(nvml)
            return None
        probe = cls(nvml, handles)
        if exclusive:
            if devices is None:
                devices = os.environ.get("CUDA_VISIBLE_DEVICES")
            probe.exclusive_indices = probe._resolve_devices(devices)
        return probe

    def _resolve_devices(self, devices: str | None) -> list[int]:
        n = len(self.handles)
        if devices is None or not devices.strip():
            return list(range(n))
        out: list[int] = []
        for entry in devices.split(","):
            entry = entry.strip()
            if not entry:
                continue
            if entry.isdigit():
                i = int(entry)
                if i < n:
                    out.append(i)
                continue
            found = None
            for i, h in enumerate(self.handles):
                try:
                    if _text(self.nvml.nvmlDeviceGetUUID(h)) == entry:
                        found = i
                        break
                except self.nvml.NVMLError:
                    continue
            if found is None:
                return list(range(n))  # MIG or unknown id: cannot narrow it down
            out.append(found)
        return out

    # -- sampling

    def _processes(self, kind: str, handle: Any) -> list[Any] | None:
        """One process list of one device; None when no query works."""
        nvml = self.nvml
        known = self._versions.get(kind)
        if known == "":
            return None
        versions = [known] if known else list(_VERSIONS)
        missing = 0
        for version in versions:
            fn = _process_query(nvml, kind, version)
            if fn is None:
                missing += 1
                continue
            try:
                procs = fn(handle)
            except nvml.NVMLError as e:
                if _is_function_not_found(nvml, e):
                    missing += 1
                    continue
                return None  # NotSupported, NoPermission...: try again next sample
            self._versions[kind] = version
            return list(procs)
        if missing == len(versions):
            self._versions[kind] = ""  # this driver has none of them: stop asking
        return None

    def query_versions(self) -> dict[str, str | None]:
        """Per process list, the query version in use ("_v3", "_v2", "_v1"), "" if none works,
        None when not tried yet."""
        return {kind: self._versions.get(kind) for kind in _PROCESS_LISTS}

    def listed_pids(self) -> set[int] | None:
        """Every pid in any process list of any device; None when no list can be read.

        An empty set means nothing holds the GPUs now: a caller may then treat them as
        held exclusively by the trial it is about to start.
        """
        seen: set[int] = set()
        readable = False
        for handle in self.handles:
            for kind in _PROCESS_LISTS:
                procs = self._processes(kind, handle)
                if procs is None:
                    continue
                readable = True
                seen.update(int(p.pid) for p in procs if getattr(p, "pid", None) is not None)
        return seen if readable else None

    def process_memory(self, pids: set[int]) -> tuple[int | None, bool]:
        """(sum, matched): the per-process memory of ``pids``; sum None when unknown."""
        per: dict[tuple[int, int], int | None] = {}
        for idx, handle in enumerate(self.handles):
            for kind in _PROCESS_LISTS:
                procs = self._processes(kind, handle)
                if not procs:
                    continue
                for p in procs:
                    pid = getattr(p, "pid", None)
                    if pid not in pids:
                        continue
                    used = getattr(p, "usedGpuMemory", None)
                    key = (idx, pid)
                    # A pid in several lists reports the same per-process total: keep one.
                    if key in per and per[key] is None:
                        continue
                    if used is None:
                        per[key] = None
                    else:
                        prev = per.get(key)
                        per[key] = max(prev or 0, int(used))
        if not per:
            return None, False
        if any(v is None for v in per.values()):
            return None, True
        return sum(v for v in per.values() if v is not None), True

    def device_memory(self) -> int | None:
        """Used memory summed over the exclusively held devices; None if not exclusive."""
        if self.exclusive_indices is None:
            return None
        total = 0
        try:
            for i in self.exclusive_indices:
                total += int(self.nvml.nvmlDeviceGetMemoryInfo(self.handles[i]).used)
        except self.nvml.NVMLError:
            return None
        return total

    def sample(self, pids: set[int]) -> tuple[int | None, str]:
        """GPU memory of ``pids`` as ``(bytes | None, "process" | "device" | "unavailable")``."""
        if self._closed:
            return None, "unavailable"
        value, _matched = self.process_memory(pids)
        if value is not None:
            return value, "process"
        dev = self.device_memory()
        if dev is not None:
            return dev, "device"
        return None, "unavailable"

    # -- description

    def describe(self) -> dict[str, Any]:
        """Machine info / runner capabilities: names, count, memory, driver and CUDA versions."""
        nvml = self.nvml
        devices = []
        for i, h in enumerate(self.handles):
            d: dict[str, Any] = {"index": i}
            for key, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
                try:
                    d[key] = _text(getattr(nvml, fn)(h))
                except (nvml.NVMLError, AttributeError):
                    d[key] = None
            try:
                d["memory_total"] = int(nvml.nvmlDeviceGetMemoryInfo(h).total)
            except nvml.NVMLError:
                d["memory_total"] = None
            devices.append(d)
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except (nvml.NVMLError, AttributeError):
            driver = None
        try:
            nvml_version = _text(nvml.nvmlSystemGetNVMLVersion())
        except (nvml.NVMLError, AttributeError):
            nvml_version = None
        try:
            cuda_int = int(nvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}"
        except (nvml.NVMLError, AttributeError):
            cuda = None
        names = sorted({d["name"] for d in devices if d["name"]})
        totals = [d["memory_total"] for d in devices]
        return {
            "available": True,
            "count": len(devices),
            "name": ", ".join(names) if names else None,
            "memory_total": sum(totals) if all(t is not None for t in totals) else None,
            "driver_version": driver,
            "nvml_version": nvml_version,
            "cuda_driver_version": cuda,
            "exclusive_devices": self.exclusive_indices,
            "devices": devices,
        }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _shutdown(self.nvml)

    def __enter__(self) -> GpuProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


EXCLUSIVE_MODES = ("auto", "yes", "no")


def open_probe(
    mode: str = "auto", nvml: ModuleType | Any | None = None, *, sharers: int = 1
) -> GpuProbe | None:
    """A probe for a runner; whether its GPUs count as held alone follows ``mode``.

    ``yes``/``no`` say so outright. ``auto`` (the default) claims them only when
    NVML lists no compute process on them at start and no other agent of this
    process shares them (``sharers``): device-level memory is then a fair
    figure for a trial whose per-process memory NVML cannot give. Judged once,
    at start: a runner that shares its GPUs with later work should say ``no``.
    """
    if mode not in EXCLUSIVE_MODES:
        raise ValueError(f"GPU exclusive mode {mode!r}: allowed are {', '.join(EXCLUSIVE_MODES)}")
    first = GpuProbe.open(nvml)
    if first is None or mode == "no":
        return first
    held = mode == "yes" or (sharers == 1 and first.listed_pids() == set())
    if not held:
        return first
    first.close()
    return GpuProbe.open(nvml, exclusive=True)


def _shutdown(nvml: Any) -> None:
    # Shutting down a broken NVML must not fail a trial.
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _is_function_not_found(nvml: Any, e: Exception) -> bool:
    code = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", _NVML_ERROR_FUNCTION_NOT_FOUND)
    return getattr(e, "value", None) == code
