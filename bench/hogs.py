"""Noisy neighbours: other processes that load the machine while a bisection runs.

- `cpu_hog(n)`: n busy processes (default one per core), each a Python loop that never
  sleeps, at normal priority, as another job on a shared CI runner or GPU node would be.
- `memory_pressure(mib)`: one process that holds `mib` MiB, written, and writes to every
  page of it again in a loop, so it all stays resident and the process keeps a core busy
  missing caches and TLB entries; its
  `oom_score_adj` is 1000, so if the machine did run short the kernel would kill it
  first, never a trial or a test. `pressure_mib()` picks a size that is real but safe.

Both are context managers that wait until their load is on (the hogs have used CPU, the
memory is allocated and written) before the block runs, and always kill and reap their
processes when it ends, however it ends. Each process also ends by itself once the
process that started it is gone (its parent changes), so a killed test leaves no hog.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import psutil

MIB = 1024 * 1024

# A busy loop that checks now and then whether its starter is still alive.
_CPU = """\
import os, sys
owner = int(sys.argv[1])
while os.getppid() == owner:
    for _ in range(200_000):
        pass
"""

# Hold MIB MiB in 64 MiB pieces, written; say "ready"; then write one byte a page, over
# and over, until the starter is gone.
_MEMORY = """\
import os, sys
owner, mib = int(sys.argv[1]), int(sys.argv[2])
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("1000")
pieces = [bytearray(b"\\x5a") * (64 << 20) for _ in range(max(1, mib // 64))]
print("ready", flush=True)
n = 0
while os.getppid() == owner:
    n = (n + 1) % 251
    for piece in pieces:
        piece[::4096] = bytes([n]) * len(range(0, len(piece), 4096))
"""


@dataclass
class Neighbour:
    """The processes of one noisy neighbour, as the block sees them."""

    what: str
    pids: list[int] = field(default_factory=list)

    def cpu_s(self) -> float:
        """CPU seconds its processes have used so far: how real the load was."""
        total = 0.0
        for pid in self.pids:
            with suppress(psutil.NoSuchProcess):
                total += sum(psutil.Process(pid).cpu_times()[:2])
        return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core, /proc/stat): what else
    loads it while a neighbour runs, such as the other workers of a test run."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def load_was_real(hog: Neighbour, wall_s: float, busy_s: float) -> str | None:
    """None when a CPU hog loaded the machine over `wall_s` seconds, in which the machine
    was busy `busy_s` CPU seconds: the hog had half a core, or the machine was 90 % busy
    on every core and the hog still had a quarter (other processes, such as a test run's
    other workers, took the rest of it). Else why not, in words."""
    used, cores = hog.cpu_s(), os.cpu_count() or 1
    if used > 0.5 * wall_s or (busy_s > 0.9 * cores * wall_s and used > 0.25 * wall_s):
        return None
    return (f"the CPU hog used {used:.1f} CPU s in {wall_s:.1f} s, the machine "
            f"{busy_s:.1f} of {cores * wall_s:.1f}")  # fmt: skip


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, str(os.getpid()), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def _busy(pid: int, timeout: float = 10.0) -> None:
    """Wait until the process has used some CPU: the hog is running, not just started."""
    proc = psutil.Process(pid)
    deadline = time.monotonic() + timeout
    while sum(proc.cpu_times()[:2]) < 0.2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"CPU hog {pid} used no CPU within {timeout:.0f} s")
        time.sleep(0.05)


@contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[Neighbour]:
    """`processes` busy processes (default: one per core) while the block runs."""
    n = processes or os.cpu_count() or 1
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(n):
            procs.append(_start(_CPU))
        for p in procs:
            _busy(p.pid)
        yield Neighbour(f"CPU hog: {n} busy processes", [p.pid for p in procs])
    finally:
        _stop(procs)


def pressure_mib(fraction: float = 0.5, cap_mib: int = 8192) -> int:
    """`fraction` of the memory available now, at most `cap_mib`, in whole 64 MiB pieces."""
    available = psutil.virtual_memory().available // MIB
    return max(64, min(cap_mib, int(available * fraction)) // 64 * 64)


@contextmanager
def memory_pressure(mib: int) -> Iterator[Neighbour]:
    """Another process holding `mib` MiB, written and written again, while the block runs."""
    proc = _start(_MEMORY, str(mib))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # until allocated and written, or it died
        if line.strip() != "ready":
            proc.wait()
            raise RuntimeError(f"memory pressure of {mib} MiB ended before it held it "
                               f"(exit {proc.returncode})")  # fmt: skip
        yield Neighbour(f"memory pressure: {mib} MiB held and rewritten", [proc.pid])
    finally:
        _stop([proc])
