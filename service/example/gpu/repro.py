"""GPU repro fixtures that need only the CUDA driver: `libcuda.so.1` through ctypes.

No PyTorch, no JAX, no CUDA toolkit: the script calls the driver API (`cuInit`,
`cuDeviceGet`, `cuCtxCreate_v2`, `cuMemAlloc_v2`/`cuMemFree_v2`,
`cuMemHostAlloc`/`cuMemFreeHost`, `cuCtxDestroy_v2`), checks every return code, and
prints the step marker ``::leakbisect-step::`` at the start of every step. Standard
library only, so it runs as a trial's script in any environment.

Variants (several may run together, one part each per step):

``device-leak``     a 16 MiB device buffer per step, never freed: monotone device
                    growth, the quantization report's shape.
``device-plateau``  a caching pool: one 16 MiB block per step until it holds 8, then
                    the same blocks are reused (PyTorch's caching allocator, XLA's BFC).
``pinned-leak``     8 MiB of pinned host memory (`cuMemHostAlloc`) per step, touched,
                    never freed: host RAM grows while device memory is flat.
``pinned-reuse``    two 8 MiB pinned buffers rewritten every step, and at every
                    checkpoint (steps 5, 15, 25...) a 64 MiB pinned staging buffer
                    held for two steps, then freed: spikes on a bounded ceiling.
``oom``             device memory in chunks of 1/48 of the device per step until
                    `cuMemAlloc_v2` fails: the run ends in CUDA out of memory.

Which variants run: ``$LEAKBISECT_GPU_VARIANT`` (comma-separated), else the
``VARIANTS`` of the installed `gpuleakfixture` release (service.example.gpu.fixture).
The driver library: ``$LEAKBISECT_CUDA_LIBRARY``, else `gpuleakfixture.CUDA_LIBRARY`
when set, else ``libcuda.so.1``. ``$LEAKBISECT_GPU_STEPS`` (default 40) and
``$LEAKBISECT_GPU_PAUSE`` (seconds per step, default 0.05) set the run's length; ``oom``
runs until the allocation fails (at most 480 steps).

Exit status (the script contract): 0 done; 125 cannot test (no CUDA driver library,
or the driver finds no device); 1 a CUDA call failed (the message names the call, the
error and the step; out of memory included); 2 bad settings.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import Any

STEP_MARKER = "::leakbisect-step::"
LIBRARY_ENV = "LEAKBISECT_CUDA_LIBRARY"
VARIANT_ENV = "LEAKBISECT_GPU_VARIANT"
STEPS_ENV = "LEAKBISECT_GPU_STEPS"
PAUSE_ENV = "LEAKBISECT_GPU_PAUSE"
DEFAULT_LIBRARY = "libcuda.so.1"
DEFAULT_STEPS = 40
DEFAULT_PAUSE = 0.05
OOM_MAX_STEPS = 480
EXIT_CUDA_ERROR = 1
EXIT_BAD_SETTINGS = 2
EXIT_CANNOT_TEST = 125

MiB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100
_ERROR_NAMES = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
}


class CudaError(Exception):
    """A driver call returned an error: ``call``, ``code`` and the error's name."""

    def __init__(self, call: str, code: int, name: str):
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code, self.name = call, code, name


class NoDriver(Exception):
    """No usable CUDA driver here: the release cannot be tested (exit 125)."""


_c = ctypes
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [_c.c_uint],
    "cuDeviceGet": [_c.POINTER(_c.c_int), _c.c_int],
    "cuDeviceGetName": [_c.c_char_p, _c.c_int, _c.c_int],
    "cuDeviceTotalMem_v2": [_c.POINTER(_c.c_size_t), _c.c_int],
    "cuCtxCreate_v2": [_c.POINTER(_c.c_void_p), _c.c_uint, _c.c_int],
    "cuCtxDestroy_v2": [_c.c_void_p],
    "cuMemAlloc_v2": [_c.POINTER(_c.c_uint64), _c.c_size_t],
    "cuMemFree_v2": [_c.c_uint64],
    "cuMemHostAlloc": [_c.POINTER(_c.c_void_p), _c.c_size_t, _c.c_uint],
    "cuMemFreeHost": [_c.c_void_p],
}


class Cuda:
    """The driver calls the fixtures make, each return code checked (`CudaError`)."""

    def __init__(self, library: str):
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise NoDriver(f"cannot load the CUDA driver {library}: {exc}") from exc
        self.library = library
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(self.lib, name)
            except AttributeError as exc:
                raise NoDriver(f"{library} is not a CUDA driver: it has no {name}") from exc
            fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def error_name(self, code: int) -> str:
        fn = getattr(self.lib, "cuGetErrorName", None)
        if fn is not None:
            text = ctypes.c_char_p()
            if fn(ctypes.c_int(code), ctypes.byref(text)) == 0 and text.value:
                return text.value.decode(errors="replace")
        return _ERROR_NAMES.get(code, "CUDA error")

    def call(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise CudaError(name, code, self.error_name(code))

    def init(self) -> int:
        """cuInit and device 0; a driver without a device raises `NoDriver`."""
        try:
            self.call("cuInit", 0)
        except CudaError as exc:
            if exc.code == CUDA_ERROR_NO_DEVICE:
                raise NoDriver(f"the CUDA driver finds no device ({exc})") from exc
            raise
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), 0)
        return dev.value

    def describe(self, dev: int) -> tuple[str, int]:
        name = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", name, 256, dev)
        total = ctypes.c_size_t()
        self.call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)
        return name.value.decode(errors="replace"), total.value

    def create_context(self, dev: int) -> int:
        ctx = ctypes.c_void_p()
        self.call("cuCtxCreate_v2", ctypes.byref(ctx), 0, dev)
        return int(ctx.value or 0)

    def destroy_context(self, ctx: int) -> None:
        self.call("cuCtxDestroy_v2", ctypes.c_void_p(ctx))

    def alloc(self, size: int) -> int:
        ptr = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(ptr), size)
        return ptr.value

    def free(self, ptr: int) -> None:
        self.call("cuMemFree_v2", ctypes.c_uint64(ptr))

    def host_alloc(self, size: int, fill: int = 0xA5) -> int:
        """Pinned host memory, every byte written (so it is resident)."""
        ptr = ctypes.c_void_p()
        self.call("cuMemHostAlloc", ctypes.byref(ptr), size, 0)
        ctypes.memset(ptr.value, fill, size)
        return int(ptr.value or 0)

    def free_host(self, ptr: int) -> None:
        self.call("cuMemFreeHost", ctypes.c_void_p(ptr))


# ----------------------------------------------------------------------------- variants


class DeviceLeak:
    """16 MiB of device memory per step, never freed."""

    def __init__(self, cuda: Cuda, total: int, block: int = 16 * MiB):
        self.cuda, self.block, self.kept = cuda, block, []

    def step(self, i: int) -> None:
        self.kept.append(self.cuda.alloc(self.block))


class DevicePlateau:
    """A caching pool: one block per step until it holds `blocks`, then reuse."""

    def __init__(self, cuda: Cuda, total: int, block: int = 16 * MiB, blocks: int = 8):
        self.cuda, self.block, self.blocks, self.pool = cuda, block, blocks, []

    def step(self, i: int) -> None:
        if len(self.pool) < self.blocks:
            self.pool.append(self.cuda.alloc(self.block))


class PinnedLeak:
    """8 MiB of pinned host memory per step, touched, never freed."""

    def __init__(self, cuda: Cuda, total: int, block: int = 8 * MiB):
        self.cuda, self.block, self.kept = cuda, block, []

    def step(self, i: int) -> None:
        self.kept.append(self.cuda.host_alloc(self.block))


class PinnedReuse:
    """Two pinned buffers rewritten every step; a staging spike at every checkpoint."""

    def __init__(
        self, cuda: Cuda, total: int, block: int = 8 * MiB, spike: int = 64 * MiB, every: int = 10
    ):
        self.cuda, self.block, self.spike_size, self.every = cuda, block, spike, every
        self.buffers = [cuda.host_alloc(block) for _ in range(2)]
        self.spike: int | None = None

    def step(self, i: int) -> None:
        for buf in self.buffers:
            ctypes.memset(buf, i & 0xFF, self.block)
        phase = i % self.every
        if phase == self.every // 2 and self.spike is None:
            self.spike = self.cuda.host_alloc(self.spike_size)
        elif phase == self.every // 2 + 2 and self.spike is not None:
            self.cuda.free_host(self.spike)
            self.spike = None


class OomEnding:
    """1/48 of the device per step until the allocation fails (CUDA out of memory)."""

    def __init__(self, cuda: Cuda, total: int):
        self.cuda, self.kept = cuda, []
        self.chunk = max(2 * MiB, total // 48 // (2 * MiB) * (2 * MiB))

    def step(self, i: int) -> None:
        self.kept.append(self.cuda.alloc(self.chunk))


VARIANTS: dict[str, Callable[[Cuda, int], Any]] = {
    "device-leak": DeviceLeak,
    "device-plateau": DevicePlateau,
    "pinned-leak": PinnedLeak,
    "pinned-reuse": PinnedReuse,
    "oom": OomEnding,
}


# ---------------------------------------------------------------------------- settings


def _fixture_attr(name: str) -> Any:
    try:
        import gpuleakfixture  # type: ignore[import-not-found]
    except ImportError:
        return None
    return getattr(gpuleakfixture, name, None)


def selected_variants() -> list[str]:
    """The variants to run; ValueError with a one-line reason when none or unknown."""
    text = os.environ.get(VARIANT_ENV)
    names = text.split(",") if text else list(_fixture_attr("VARIANTS") or [])
    names = [n.strip() for n in names if n.strip()]
    known = ", ".join(VARIANTS)
    if not names:
        raise ValueError(f"no variant: set {VARIANT_ENV} to one or more of {known}")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"{VARIANT_ENV}: unknown variant {unknown[0]!r}; known: {known}")
    return names


def library_path() -> str:
    return os.environ.get(LIBRARY_ENV) or _fixture_attr("CUDA_LIBRARY") or DEFAULT_LIBRARY


def _number(env: str, default: float, kind: type) -> Any:
    text = os.environ.get(env)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if value <= 0:
        raise ValueError(f"{env}: {text!r} is not a positive {kind.__name__}")
    return value


# --------------------------------------------------------------------------------- run


def run(cuda: Cuda, names: list[str], steps: int, pause: float) -> int:
    """Create a context, run every variant's step `steps` times, destroy the context."""
    dev = cuda.init()
    name, total = cuda.describe(dev)
    print(f"device 0: {name}, {total // MiB} MiB; variants: {', '.join(names)}", flush=True)
    ctx = cuda.create_context(dev)
    parts = [VARIANTS[n](cuda, total) for n in names]
    if "oom" in names:
        steps = OOM_MAX_STEPS
    for i in range(1, steps + 1):
        print(STEP_MARKER, flush=True)
        try:
            for part in parts:
                part.step(i)
        except CudaError as exc:
            exc.args = (f"{exc} at step {i}",)
            raise
        time.sleep(pause)
    time.sleep(pause)  # hold the last state for one more sample before tearing down
    cuda.destroy_context(ctx)
    return steps


def main() -> int:
    try:
        names = selected_variants()
        steps = _number(STEPS_ENV, DEFAULT_STEPS, int)
        pause = _number(PAUSE_ENV, DEFAULT_PAUSE, float)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    return with_cuda(lambda cuda: run(cuda, names, steps, pause))


def with_cuda(work: Callable[[Cuda], object]) -> int:
    """Run `work` on the driver library; the script contract's exit status: 0, 125 without
    a CUDA driver, 1 when a CUDA call fails (said on stderr). pinned_probe.py shares it."""
    try:
        work(Cuda(library_path()))
    except NoDriver as exc:
        print(f"cannot test: {exc}", file=sys.stderr)
        return EXIT_CANNOT_TEST
    except CudaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CUDA_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
