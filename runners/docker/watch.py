"""Watch one run-phase container: logs, memory samples, the end, the OOM verdict.

`watch` is called with a started container. Two threads follow its stdout (step markers,
via `runners.executor`'s output reader, so markers and tails work exactly as for the
subprocess executor) and stderr (where `runners.docker.entry` reports the script's exit);
the calling thread samples the container's cgroup (`runners.docker.cgroup`) at the
trial's rate (50 per second for the first 30 s, as `runners.sampler`), and the GPU from
the agent's own NVML view by the cgroup's host PIDs. It stops at the exit report, when
the container dies on its own, at the timeout, when killed, or when the trial's early-stop
rule fires (the run's `contract.earlystop.EarlyStopper`, looking every `look_every_s` at the
samples so far, as the subprocess executor does; the execution records its horizon and
looks), then reads the counters once more (the cgroup still exists: the entry holds the
container open).

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

from contract.earlystop import EarlyStopper, seen_by_samples
from contract.wire import EarlyStop, Sample
from runners.docker.cgroup import ContainerCgroup, Counters, find
from runners.docker.entry import EXIT_MARKER
from runners.executor import Execution, _Output
from runners.nvml import GpuProbe

FAST_HZ = 50.0
FAST_S = 30.0
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


@dataclass
class Watch:
    """What the loop saw, shared between its threads."""

    exit_code: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    killed: bool = False
    last: Counters | None = None
    oom_kills: int = 0
    peak: int = 0
    samples: list[Sample] = field(default_factory=list)
    gpu_source: str = "unavailable"
    stopped_early: str | None = None  # why the early-stop rule ended the run
    stopper: EarlyStopper | None = None  # the run's looks (None: no early-stop settings)

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


def _follow(container: Any, out: _Output, watch: Watch) -> list[threading.Thread]:
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


def _sample(cg: ContainerCgroup, gpu: GpuProbe | None, t: float, step: int, w: Watch
            ) -> Sample | None:
    """One sample; None once the cgroup is gone (the container died)."""
    c = cg.read()
    if c is None:
        return None
    w.count(c)
    g = None
    if gpu is not None:
        g, w.gpu_source = gpu.sample(set(cg.pids()))
    return Sample(t=t, rss=c.rss, anon=c.anon, shared=c.shmem, gpu=g, step=step or None)


@dataclass
class WatchArgs:
    timeout_s: float
    sample_hz: float
    memory_limit_bytes: int
    cgroup_root: Any
    gpu: GpuProbe | None = None
    on_sample: Callable[[Sample], None] | None = None
    early_stop: EarlyStop | None = None


def _loop(container: Any, cg: ContainerCgroup | None, args: WatchArgs, w: Watch,
          out: _Output, t0: float) -> bool:
    """Sample until the script ends; True when it ran past its timeout."""
    next_look = 0.0 if args.early_stop is None else args.early_stop.look_every_s
    w.stopper = None if args.early_stop is None else EarlyStopper(args.early_stop)
    while not w.done.is_set():
        t = time.monotonic() - t0
        if t > args.timeout_s:
            return True
        if w.stopper is not None and t >= next_look:
            next_look = t + w.stopper.es.look_every_s
            if _look(w, out, args):
                break
        if cg is not None:
            with out.lock:
                step = out.steps[-1][1] if out.steps else 0
            s = _sample(cg, args.gpu, t, step, w)
            if s is None:  # the container died without the entry's report
                break
            w.samples.append(s)
            if args.on_sample is not None:
                args.on_sample(s)
        elif not _running(container):
            break
        period = 1.0 / (FAST_HZ if t < FAST_S and args.sample_hz < FAST_HZ else args.sample_hz)
        if w.done.wait(period):
            break
        if w.killed:
            break
    return False


def _look(w: Watch, out: _Output, args: WatchArgs) -> bool:
    """One look of the run's `EarlyStopper` (as runners/executor.py takes them); True: stop
    now, and the container is killed as for a timeout."""
    assert w.stopper is not None
    samples = list(w.samples)
    with out.lock:
        steps = seen_by_samples(out.steps, samples[-1].step if samples else None)
    reason = w.stopper.look(
        [s.t for s in samples], [s.rss for s in samples], steps, args.memory_limit_bytes
    )
    if reason is None:
        return False
    w.stopped_early, w.killed = reason, True
    return True


def watch(container: Any, args: WatchArgs, w: Watch, t0: float) -> Execution:
    """Follow a started run-phase container to its end; it is stopped, not removed."""
    out = _Output(t0, on_step=lambda _n: None)
    threads = _follow(container, out, w)
    cg = _cgroup(container, args.cgroup_root)
    timed_out = _loop(container, cg, args, w, out, t0)
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
                      timed_out or w.killed)  # fmt: skip
    notes = []
    if w.exit_code is None:
        notes.append("the container ended without the entry's exit report")
    crashed = code not in (0, 125)
    return Execution(
        exit_code=code,
        oom_killed=oom,
        timed_out=timed_out,
        cap_method=f"docker-{cg.source}" if cg else "docker",
        duration_s=round(duration, 3),
        log_tail=out.log_tail(crashed),
        samples=w.samples,
        steps=list(out.steps),
        gpu_source=w.gpu_source,
        host_source=cg.source if cg else "unavailable",
        stderr_tail=out.stderr.text(),
        memory_limit_bytes=args.memory_limit_bytes,
        peak_rss=max((s.rss for s in w.samples), default=0),
        cgroup_peak_bytes=w.peak or None,
        oom_kill_count=w.oom_kills,
        cap_notes=notes,
        stopped_early=w.stopped_early,
        early_stop=None if w.stopper is None else w.stopper.record(),
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
