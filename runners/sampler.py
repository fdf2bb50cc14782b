"""Samples a process tree's memory in a background thread.

Host memory comes from psutil: the tree's processes, RSS summed, with ``shared``
(file-backed and shmem pages, where pinned CUDA host memory shows up) and
``anon = rss - shared`` where the platform gives them (Linux ``memory_info()``
reads ``/proc/PID/statm``: a few microseconds). ``memory_full_info`` (USS/PSS)
is never used here: it walks smaps and costs milliseconds per call on a large
process. GPU memory comes from a `runners.nvml.GpuProbe` when one is given.

The tree: the root pid and its descendants (``include_root=False`` leaves the root
out: a trial's root is its supervisor, `runners.shim`, whose own memory is not the
trial's; ``exclude`` leaves out other pids, the trial's PID-namespace init: its
descendants, the script and every orphan re-parented to the init, are sampled),
listed through ``/proc/PID/task/TID/children`` (`runners.shim.descendants`: one
small read per process of the tree), plus what ``listed`` returns (the trial's
cgroup.procs). The list is refreshed every ``refresh_s`` (default about once a
second; trials at most every 20 ms, `runners.executor.REFRESH_S`, so a double fork cannot
hide for longer, while the readings at step markers in between cost only the reading), and
at every sample while no process of the tree is known yet (a trial's first readings come
before its script has started). Processes that vanish between
refreshes are normal and skipped, and so are zombies (RSS 0); one that left the tree
(re-parented away) is still sampled while it lives. Every process ever seen stays in
`seen` for the caller's clean-up.

Escapes: with ``inside`` (the pids of the trial's memory cgroup), a process of
the tree that is alive and not in that cgroup left the cap: it is SIGKILLed at
once and listed in `escaped`.

The watchdog: when ``watchdog_limit_bytes`` is set (the trial's cap method is
"watchdog", i.e. no cgroup), a sample whose tree RSS exceeds it kills the
tree, then calls ``on_watchdog``; so does a tree of more than ``pids_limit``
processes (a fork bomb without a pids cgroup). `watchdog_reason` says which.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

import psutil

from contract.wire import Sample
from runners.nvml import GpuProbe
from runners.shim import descendants

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
        include_root: bool = True,
        listed: Callable[[], Iterable[int]] | None = None,
        inside: Callable[[], set[int]] | None = None,
        pids_limit: int | None = None,
        exclude: Iterable[int] = (),
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
        self.include_root = include_root
        self.listed = listed
        self.inside = inside
        self.pids_limit = pids_limit
        self.exclude = frozenset(exclude)

        self.samples: list[Sample] = []
        self.step: int | None = None  # set by whoever parses step markers
        self.gpu_sources: Counter[str] = Counter()
        self.watchdog_fired = False
        self.peak_rss = 0
        self.refreshes = 0
        self.watchdog_reason: str | None = None
        self.escaped: list[int] = []
        self.seen: dict[int, psutil.Process] = {}

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
            if self.include_root:
                self._procs[self.pid] = self._root
        except _GONE:
            self._root = None
        if not self.include_root:
            return self  # the tree is killed member by member, never the root's group
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
        """Re-list the tree: the root's descendants and the ``listed`` pids."""
        self._last_refresh = time.monotonic()
        self.refreshes += 1
        tree = set(descendants(self.pid)) if self._root is not None else set()
        if self.listed is not None:
            tree.update(self.listed())
        if self.include_root and self._root is not None and self.pid in self._procs:
            tree.add(self.pid)
        else:
            tree.discard(self.pid)
        tree -= self.exclude
        procs: dict[int, psutil.Process] = {}
        for pid in tree:
            # Keep the existing object (it remembers the create time: pid reuse is detected).
            p = self._procs.get(pid) or self._process(pid)
            if p is not None:
                procs[pid] = p
        # Orphans re-parented away from the root keep being sampled while they live.
        for pid, p in self._procs.items():
            if pid not in procs and p.is_running():
                procs[pid] = p
        self._procs = procs
        self.seen.update(procs)
        if self.inside is not None:
            self._kill_escaped(procs)

    @staticmethod
    def _process(pid: int) -> psutil.Process | None:
        try:
            return psutil.Process(pid)
        except _GONE:
            return None

    def _kill_escaped(self, procs: dict[int, psutil.Process]) -> None:
        """Kill live processes of the tree that are not in the trial's memory cgroup."""
        assert self.inside is not None
        outside = [pid for pid in procs if pid != self.pid] if procs else []
        if not outside:
            return
        inside = self.inside()
        outside = [pid for pid in outside if pid not in inside]
        if not outside:
            return
        inside = self.inside()  # again: a process that just exited has left the cgroup too
        for pid in outside:
            p = procs[pid]
            with contextlib.suppress(*_GONE):
                if pid not in inside and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
                    self.escaped.append(pid)
                    log.warning("pid %d left the trial's cgroup: killed", pid)

    # -- sampling

    def sample_once(self) -> Sample | None:
        """Take one sample now and append it; None when no process of the tree is alive."""
        sample = self.take(self.step)
        if sample is None:
            return None
        self.samples.append(sample)
        if self.on_sample is not None:
            try:
                self.on_sample(sample)
            except Exception:  # noqa: BLE001 - a display callback must not stop sampling
                if not self._callback_failed:
                    self._callback_failed = True
                    log.exception("on_sample callback failed")
        return sample

    def take(self, step: int | None, t: float | None = None) -> Sample | None:
        """One sample carrying `step`, not kept (the trials' watch loop, `runners.watch`,
        keeps its own): the tree re-listed when due, escapes killed, the peak and the
        watchdog updated; `t` defaults to now. None when no process of the tree is alive."""
        if not self._attached:
            self.attach()
        # Re-listed when due, and whenever no process is known yet (a trial's first
        # readings come before its script has started under the supervisor).
        if not self._procs or time.monotonic() - self._last_refresh >= self.refresh_s:
            self.refresh()
        rss, shared, alive = self._host()
        if not alive:
            return None
        assert self.start_time is not None
        sample = Sample(
            t=time.monotonic() - self.start_time if t is None else t,
            rss=rss,
            anon=rss - shared if shared is not None else None,
            shared=shared,
            gpu=self._gpu(alive),
            step=step,
        )
        if rss > self.peak_rss:
            self.peak_rss = rss
        self._watch(rss)
        return sample

    def _host(self) -> tuple[int, int | None, list[int]]:
        """RSS and shared bytes summed over the live tree (shared None: not given), its pids."""
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
        return rss, shared if have_shared else None, alive

    def _gpu(self, alive: list[int]) -> int | None:
        if self.gpu is None:
            return None
        try:
            gpu, source = self.gpu.sample(set(alive))
        except Exception as e:  # noqa: BLE001 - a flaky driver must not stop host sampling
            log.debug("GPU sample failed: %s", e)
            gpu, source = None, "unavailable"
        self.gpu_sources[source] += 1
        return gpu

    def _watch(self, rss: int) -> None:
        if self.watchdog_fired:
            return
        if self.watchdog_limit_bytes is not None and rss > self.watchdog_limit_bytes:
            self.watchdog_reason = f"memory {rss} > {self.watchdog_limit_bytes} bytes"
        elif self.pids_limit is not None and len(self._procs) > self.pids_limit:
            self.watchdog_reason = f"{len(self._procs)} processes > {self.pids_limit}"
        else:
            return
        self.kill_tree()
        self.watchdog_fired = True
        if self.on_watchdog is not None:
            self.on_watchdog()

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


def _bench(seconds: float = 10.0, hz: float = 10.0, refresh_s: float = 1.0) -> None:
    """Print the sampler's CPU cost for a 1-process and a 4-process tree.

    ``python -m runners.sampler [seconds] [hz] [refresh_s]`` (trials use refresh_s 0:
    the tree is re-listed at every sample). The bench process only sleeps in its main
    thread, so its CPU time is the sampler thread's.
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
            s = Sampler(p.pid, hz=hz, refresh_s=refresh_s)
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

    _bench(*(float(a) for a in sys.argv[1:4]))
