"""Samples a process tree's memory in a background thread.

Host memory comes from psutil: the root pid and its descendants, RSS summed,
with ``shared`` (file-backed and shmem pages, where pinned CUDA host memory
shows up) and ``anon = rss - shared`` where the platform gives them (Linux
``memory_info()`` reads ``/proc/PID/statm``: a few microseconds). The
children list is refreshed about once a second, not at every sample: listing
descendants reads every process's stat file on the machine. Processes that
vanish between refreshes are normal and skipped, and so are zombies (RSS 0).
``memory_full_info`` (USS/PSS) is never used here: it walks smaps and costs
milliseconds per call on a large process.

GPU memory comes from a `runners.nvml.GpuProbe` when one is given.

The watchdog: when ``watchdog_limit_bytes`` is set (the trial's cap method is
"watchdog", i.e. no cgroup), a sample whose tree RSS exceeds it SIGKILLs the
tree's process group and every known member, then calls ``on_watchdog``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable

import psutil

from runners.nvml import GpuProbe
from runners.wire import Sample

log = logging.getLogger(__name__)

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


class Sampler:
    """Sample ``pid`` and its descendants at ``hz`` until `stop()`.

    ``start_time`` is the `time.monotonic()` instant that sample times are
    relative to (default: when `start()` is called); pass the spawn time so
    samples and step markers share one clock.

    For the first ``fast_start_s`` seconds it samples at ``fast_hz`` (when
    that is faster than ``hz``): a repro of a few seconds then still gives
    the classifier enough points per step, while an hours-long run settles to
    ``hz`` and its series stays small.
    """

    def __init__(
        self,
        pid: int,
        *,
        hz: float = 10.0,
        gpu: GpuProbe | None = None,
        start_time: float | None = None,
        refresh_s: float = 1.0,
        watchdog_limit_bytes: int | None = None,
        on_watchdog: Callable[[], None] | None = None,
        on_sample: Callable[[Sample], None] | None = None,
        fast_hz: float = 50.0,
        fast_start_s: float = 30.0,
    ):
        if hz <= 0:
            raise ValueError("hz must be positive")
        self.pid = pid
        self.period = 1.0 / hz
        self.fast_period = min(self.period, 1.0 / fast_hz) if fast_hz > 0 else self.period
        self.fast_start_s = fast_start_s
        self.gpu = gpu
        self.start_time = start_time
        self.refresh_s = refresh_s
        self.watchdog_limit_bytes = watchdog_limit_bytes
        self.on_watchdog = on_watchdog
        self.on_sample = on_sample

        self.samples: list[Sample] = []
        self.step: int | None = None  # set by whoever parses step markers
        self.gpu_sources: Counter[str] = Counter()
        self.watchdog_fired = False
        self.peak_rss = 0
        self.refreshes = 0

        self._procs: dict[int, psutil.Process] = {}
        self._root: psutil.Process | None = None
        self._pgid: int | None = None
        self._last_refresh = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._callback_failed = False
        self._attached = False

    # -- lifecycle

    def attach(self) -> Sampler:
        """Find the root process; `start()` does it, call it directly to sample synchronously."""
        if self._attached:
            return self
        self._attached = True
        if self.start_time is None:
            self.start_time = time.monotonic()
        try:
            self._root = psutil.Process(self.pid)
            self._procs[self.pid] = self._root
        except _GONE:
            self._root = None
        with contextlib.suppress(OSError):
            pgid = os.getpgid(self.pid)
            # Never the sampler's own group: a tree that was not started in its
            # own session is killed member by member only.
            if pgid != os.getpgrp():
                self._pgid = pgid
        return self

    def start(self) -> Sampler:
        """Attach and sample in a background thread until `stop()`."""
        self.attach()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> list[Sample]:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return self.samples

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_step(self, step: int | None) -> None:
        self.step = step

    # -- the tree

    def pids(self) -> set[int]:
        """The pids of the tree as last seen."""
        return set(self._procs)

    def refresh(self) -> None:
        """Re-list the root's descendants (costly: once a second is plenty)."""
        self._last_refresh = time.monotonic()
        self.refreshes += 1
        root = self._root
        if root is None:
            return
        try:
            children = root.children(recursive=True)
        except _GONE:
            children = []
        procs = {self.pid: root} if root.pid in self._procs else {}
        for c in children:
            # Keep the existing object (it remembers the create time: pid reuse is detected).
            procs[c.pid] = self._procs.get(c.pid, c)
        # Orphans re-parented away from the root keep being sampled while they live.
        for pid, p in self._procs.items():
            if pid not in procs and p.is_running():
                procs[pid] = p
        self._procs = procs

    # -- sampling

    def sample_once(self) -> Sample | None:
        """Take one sample now and append it; None when no process of the tree is alive."""
        if not self._attached:
            self.attach()
        if time.monotonic() - self._last_refresh >= self.refresh_s:
            self.refresh()
        rss = shared = 0
        have_shared = True
        alive: list[int] = []
        dead: list[int] = []
        for pid, p in self._procs.items():
            try:
                mi = p.memory_info()
            except _GONE:
                dead.append(pid)
                continue
            if mi.rss == 0:  # a zombie reads as all zeros
                continue
            rss += mi.rss
            s = getattr(mi, "shared", None)
            if s is None:
                have_shared = False
            else:
                shared += s
            alive.append(pid)
        for pid in dead:
            self._procs.pop(pid, None)
        if not alive:
            return None
        gpu = None
        if self.gpu is not None:
            try:
                gpu, source = self.gpu.sample(set(alive))
            except Exception as e:  # noqa: BLE001 - a flaky driver must not stop host sampling
                log.debug("GPU sample failed: %s", e)
                gpu, source = None, "unavailable"
            self.gpu_sources[source] += 1
        assert self.start_time is not None
        sample = Sample(
            t=time.monotonic() - self.start_time,
            rss=rss,
            anon=rss - shared if have_shared else None,
            shared=shared if have_shared else None,
            gpu=gpu,
            step=self.step,
        )
        self.samples.append(sample)
        if rss > self.peak_rss:
            self.peak_rss = rss
        if (
            self.watchdog_limit_bytes is not None
            and not self.watchdog_fired
            and rss > self.watchdog_limit_bytes
        ):
            self.kill_tree()
            self.watchdog_fired = True
            if self.on_watchdog is not None:
                self.on_watchdog()
        if self.on_sample is not None:
            try:
                self.on_sample(sample)
            except Exception:  # noqa: BLE001 - a display callback must not stop sampling
                if not self._callback_failed:
                    self._callback_failed = True
                    log.exception("on_sample callback failed")
        return sample

    def kill_tree(self) -> None:
        """SIGKILL the tree's process group and every member known to the sampler."""
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pgid, signal.SIGKILL)
        for p in list(self._procs.values()):
            with contextlib.suppress(*_GONE):
                p.kill()  # psutil checks the create time first: no pid-reuse accidents

    def _run(self) -> None:
        began = next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - keep sampling; log the first surprise
                log.exception("sampler iteration failed")
            fast = next_at - began < self.fast_start_s
            next_at += self.fast_period if fast else self.period
            now = time.monotonic()
            if next_at < now:  # fell behind (suspended, overloaded): do not burst
                next_at = now + self.period
            self._stop.wait(next_at - now)

    # -- summary

    @property
    def gpu_source(self) -> str:
        """The GPU source: "process" if any sample had per-process figures, else "device"..."""
        for s in ("process", "device"):
            if self.gpu_sources.get(s):
                return s
        return "unavailable"


# --------------------------------------------------------------------------- overhead bench


def _bench(seconds: float = 10.0, hz: float = 10.0) -> None:
    """Print the sampler's CPU cost for a 1-process and a 4-process tree.

    ``python -m runners.sampler [seconds] [hz]``. The bench process only
    sleeps in its main thread, so its CPU time is the sampler thread's.
    """
    import subprocess
    import sys

    hold = "import time; b = b'x' * (50 * 2**20); time.sleep(3600)"
    four = (
        "import subprocess, sys, time; "
        f"ps = [subprocess.Popen([sys.executable, '-c', {hold!r}]) for _ in range(3)]; "
        "b = b'x' * (50 * 2**20); time.sleep(3600)"
    )
    for label, code, n in (("1-process", hold, 1), ("4-process", four, 4)):
        p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        try:
            time.sleep(1.0)  # let the tree start
            s = Sampler(p.pid, hz=hz)
            c0, w0 = time.process_time(), time.monotonic()
            s.start()
            time.sleep(seconds)
            s.stop()
            cpu, wall = time.process_time() - c0, time.monotonic() - w0
            assert len(s.pids()) == n, s.pids()
            print(
                f"{label} tree at {hz:g} Hz: {cpu / wall:.5f} CPU s per s "
                f"({cpu / max(len(s.samples), 1) * 1e6:.0f} us per sample, "
                f"{len(s.samples)} samples, {s.refreshes} refreshes, "
                f"{len(psutil.pids())} processes on the machine)"
            )
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


if __name__ == "__main__":
    import sys

    _bench(*(float(a) for a in sys.argv[1:3]))
