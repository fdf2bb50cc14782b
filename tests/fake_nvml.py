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
* process entries have ``pid`` and ``usedGpuMemory`` (None = not available);
* ``init_error`` makes ``nvmlInit`` fail (e.g. LIBRARY_NOT_FOUND: no driver).

Every call is appended to ``calls`` so tests can see which variant was used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class FakeNVMLError(Exception):
    """Like pynvml.NVMLError: carries the NVML return code in ``value``."""

    def __init__(self, value: int):
        super().__init__(f"fake NVML error {value}")
        self.value = value


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
            for variant in ("_v3", "_v2", ""):
                name = f"nvmlDeviceGet{kind}RunningProcesses{variant}"
                setattr(self, name, self._process_query(name, attr))

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
            return list(getattr(self.devices[handle], attr))

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
        return SimpleNamespace(total=d.total, used=d.used, free=d.total - d.used)

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._call("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._call("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version
