"""One run-phase container as the shared watch loop's sample source; its end and OOM verdict.

`watch` is called with a started container. Two threads follow its stdout (step markers,
via `runners.watch.Output`, so markers and tails work exactly as for the subprocess
executor) and stderr (where `runners.docker.entry` reports the script's exit); the watch
loop (`runners.watch.watch`: deadline, early-stop looks, the sample clock) samples the
container's cgroup (`runners.docker.cgroup`, `_CgroupSource`) and the GPU from the agent's
own NVML view by the cgroup's host PIDs. The run ends at the exit report, when the
container dies on its own (its cgroup is gone, or, with no cgroup found, it stops
running), at the timeout, when killed, or when the trial's early-stop rule fires; the
counters are then read once more (the cgroup still exists: the entry holds the container
open) and the container is killed.

OOM: ``State.OOMKilled`` *or* a positive ``oom_kill`` counter (the flag alone misses
kills); an exit 137 with neither is a kill (``-9``), not an OOM.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from contract.wire import EarlyStop, Sample
from runners.docker.cgroup import ContainerCgroup, Counters, find
from runners.docker.entry import EXIT_MARKER
from runners.nvml import GpuProbe
from runners.watch import Execution, Output, Readings, WatchArgs
from runners.watch import watch as watch_run

CGROUP_WAIT_S = 5.0


class _Lines:
    """A file-like ``readline`` over the byte chunks of a docker log stream."""

    def __init__(self, chunks: Iterator[bytes], on_line: Callable[[bytes], bool] | None = None):
        self.chunks = chunks
        self.buf = b""
        self.on_line = on_line  # returns True to swallow a line (the entry's exit report)

    def _next_line(self, limit: int) -> bytes:
        while b"\n" not in self.buf and len(self.buf) < limit:
            try:
                self.buf += next(self.chunks)
            except (StopIteration, OSError, ValueError):
                break
        cut = self.buf.find(b"\n")
        end = cut + 1 if 0 <= cut < limit else min(limit, len(self.buf))
        line, self.buf = self.buf[:end], self.buf[end:]
        return line

    def readline(self, limit: int = 1 << 16) -> bytes:
        while True:
            line = self._next_line(limit)
            if not line or self.on_line is None or not self.on_line(line):
                return line

    def behind(self) -> bool:
        """A whole line already came that the reader has not taken (`runners.watch.Output`)."""
        return b"\n" in self.buf


@dataclass
class Watch:
    """What the container's threads saw, and ``killed``: a kill from another thread (the
    trial's `Kill`) or from the watch loop (timeout, early stop) ended the run."""

    exit_code: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    killed: bool = False
    last: Counters | None = None
    oom_kills: int = 0
    peak: int = 0
    gpu_source: str = "unavailable"

    def exit_report(self, line: bytes) -> bool:
        text = line.decode("utf-8", "replace").strip()
        if not text.startswith(EXIT_MARKER):
            return False
        try:
            self.exit_code = int(text[len(EXIT_MARKER) :].strip())
        except ValueError:
            return False
        self.done.set()
        return True

    def count(self, c: Counters | None) -> None:
        if c is None:
            return
        self.last = c
        self.oom_kills = max(self.oom_kills, c.oom_kill or 0)
        self.peak = max(self.peak, c.peak or c.usage)


def _follow(container: Any, out: Output, watch: Watch) -> list[threading.Thread]:
    def stream(stdout: bool) -> Iterator[bytes]:
        return container.logs(stream=True, follow=True, stdout=stdout, stderr=not stdout)

    threads = [
        threading.Thread(target=out.read_stdout, args=(_Lines(stream(True)),), daemon=True),
        threading.Thread(
            target=out.read_stderr, args=(_Lines(stream(False), watch.exit_report),), daemon=True
        ),
    ]
    for t in threads:
        t.start()
    return threads


def _cgroup(container: Any, root: Any) -> ContainerCgroup | None:
    deadline = time.monotonic() + CGROUP_WAIT_S
    while time.monotonic() < deadline:
        cg = find(container.id, root)
        if cg is not None:
            return cg
        time.sleep(0.02)
    return None


class _CgroupSource:
    """The `runners.watch.SampleSource` of a container: its cgroup's counters (and the
    GPU by the cgroup's host PIDs); the end is the entry's exit report, a kill, or the
    container gone (the cgroup vanished; with no cgroup, the container stopped running)."""

    def __init__(self, container: Any, cg: ContainerCgroup | None, gpu: GpuProbe | None,
                 w: Watch) -> None:  # fmt: skip
        self.container, self.cg, self.gpu, self.w = container, cg, gpu, w
        self.gone = False

    def sample(self, t: float, step: int | None) -> Sample | None:
        if self.cg is None:
            self.gone = not _running(self.container)
            return None
        c = self.cg.read()
        if c is None:  # the container died without the entry's report
            self.gone = True
            return None
        self.w.count(c)
        g = None
        if self.gpu is not None:
            g, self.w.gpu_source = self.gpu.sample(set(self.cg.pids()))
        return Sample(t=t, rss=c.rss, anon=c.anon, shared=c.shmem, gpu=g, step=step)

    def wait_end(self, timeout: float) -> bool:
        if self.gone:
            return True
        return self.w.done.wait(timeout) or self.w.killed

    def stop(self) -> None:
        # Killed once the loop is over: the last counters are read before the cgroup goes.
        self.w.killed = True


@dataclass
class RunArgs:
    timeout_s: float
    sample_hz: float
    memory_limit_bytes: int
    cgroup_root: Any
    gpu: GpuProbe | None = None
    on_sample: Callable[[Sample], None] | None = None
    early_stop: EarlyStop | None = None


def watch(container: Any, args: RunArgs, w: Watch, t0: float) -> Execution:
    """Follow a started run-phase container to its end; it is stopped, not removed."""
    rules = WatchArgs(t0=t0, deadline=t0 + args.timeout_s, sample_hz=args.sample_hz,
                      memory_limit_bytes=args.memory_limit_bytes, early_stop=args.early_stop,
                      on_sample=args.on_sample)  # fmt: skip
    source = _CgroupSource(container, None, args.gpu, w)
    readings = Readings(source, rules)
    out = Output(t0, on_marker=readings.at_marker)
    threads = _follow(container, out, w)
    source.cg = cg = _cgroup(container, args.cgroup_root)
    seen = watch_run(readings, out)
    if cg is not None:
        w.count(cg.read())  # the final counters, before the cgroup goes with the container
    duration = time.monotonic() - t0
    if _running(container):  # the entry holds it open (or the script runs on): end it
        with contextlib.suppress(Exception):
            container.kill()
    state = container.wait(timeout=30)
    container.reload()
    st = container.attrs.get("State", {})
    for t in threads:
        t.join(timeout=5)
    oom = bool(st.get("OOMKilled")) or w.oom_kills > 0
    code = _exit_code(w.exit_code, int(state.get("StatusCode", st.get("ExitCode", 0))), oom,
                      seen.timed_out or w.killed)  # fmt: skip
    notes = []
    if w.exit_code is None:
        notes.append("the container ended without the entry's exit report")
    crashed = code not in (0, 125)
    return Execution(
        exit_code=code,
        oom_killed=oom,
        timed_out=seen.timed_out,
        cap_method=f"docker-{cg.source}" if cg else "docker",
        duration_s=round(duration, 3),
        log_tail=out.log_tail(crashed),
        samples=seen.samples,
        steps=list(out.steps),
        gpu_source=w.gpu_source,
        host_source=cg.source if cg else "unavailable",
        stderr_tail=out.stderr.text(),
        memory_limit_bytes=args.memory_limit_bytes,
        peak_rss=max((s.rss for s in seen.samples), default=0),
        cgroup_peak_bytes=w.peak or None,
        oom_kill_count=w.oom_kills,
        cap_notes=notes,
        stopped_early=seen.stopped_early,
        early_stop=seen.early_stop,
    )


def _running(container: Any) -> bool:
    try:
        container.reload()
    except Exception:  # noqa: BLE001 - gone is not running
        return False
    return container.status in ("running", "created", "paused")


def _exit_code(reported: int | None, status: int, oom: bool, killed: bool) -> int:
    """The script's exit: the entry's report, else the container's status.

    Without a report the container died with it: 128+N from docker-init is signal N, and
    137 is SIGKILL (an OOM kill when the counters say so, else ours or another's kill).
    """
    if reported is not None and not (killed and reported == 0):
        return reported
    if oom or killed:
        return -9
    if 128 < status <= 128 + 64:
        return -(status - 128)
    return status
