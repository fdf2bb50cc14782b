"""Runs one repro script as a local subprocess, capped and sampled.

`run_script` starts ``python script`` in its own session (so the whole tree
shares a process group that can be killed at once), inside a `MemoryCap`
(cgroup v2, else cgroup v1, else the sampler's watchdog), samples it with a
`Sampler`, parses step markers from stdout, and returns an `Execution`.

Every trial runs under a cap: when ``memory_limit_bytes`` is None the cap is
`runners.limits.default_limit_bytes()`, 80% of the memory available to the
runner (the machine's available memory, or the head-room under the runner's
own cgroup limit when that is smaller).

Outcomes:

* ``exit_code`` is the script's exit status, passed through (125 means "skip
  this candidate" to the classifier); a signal death is ``-signum``.
* Killed by the cap: ``oom_killed=True`` and ``exit_code == -9``. (With cgroup
  v1 the kernel kills the largest task only; if that was a worker and the
  script then exits on its own, ``oom_killed`` is True and the script's own
  exit code is kept.)
* Past ``timeout_s``: the whole tree is SIGKILLed, ``timed_out=True``.
* After the script exits, whatever it left running in its process group or
  cgroup is killed: a trial leaves no processes behind.

``env`` is the script's complete environment as with `subprocess.Popen`
(None: inherit the runner's); ``PYTHONUNBUFFERED=1`` is added unless set so
that step markers arrive on time. ``on_sample`` is called from the sampler
thread with every sample (for live displays); keep it quick.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from runners.limits import CapMethod, MemoryCap, default_limit_bytes
from runners.markers import parse_marker
from runners.nvml import GpuProbe
from runners.sampler import Sampler
from runners.wire import Sample

LOG_TAIL_BYTES = 4096
STDERR_TAIL_BYTES = 2048
_MAX_LINE = 64 * 1024  # longer lines are split; a runaway print cannot eat the runner's memory


@dataclass
class Execution:
    exit_code: int | None
    oom_killed: bool
    timed_out: bool
    cap_method: str
    duration_s: float
    log_tail: str
    samples: list[Sample] = field(default_factory=list)
    steps: list[tuple[float, int]] = field(default_factory=list)
    gpu_source: str = "unavailable"
    host_source: str = "psutil"
    stderr_tail: str = ""
    memory_limit_bytes: int = 0
    peak_rss: int = 0
    cgroup_peak_bytes: int | None = None
    oom_kill_count: int | None = None
    cap_notes: list[str] = field(default_factory=list)


class _Tail:
    """The last ``limit`` characters of a stream of lines."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lines: deque[str] = deque()
        self.size = 0

    def add(self, line: str) -> None:
        if len(line) > self.limit:
            line = line[-self.limit :]
        self.lines.append(line)
        self.size += len(line)
        while self.size > self.limit and len(self.lines) > 1:
            self.size -= len(self.lines.popleft())

    def text(self) -> str:
        s = "".join(self.lines)
        return s[-self.limit :]


class _Output:
    """Reads the child's stdout (markers) and stderr into tails."""

    def __init__(self, t0: float, on_step: Callable[[int], None]):
        self.t0 = t0
        self.on_step = on_step
        self.lock = threading.Lock()
        self.merged = _Tail(LOG_TAIL_BYTES)
        self.stderr = _Tail(LOG_TAIL_BYTES)
        self.steps: list[tuple[float, int]] = []
        self._last_step = 0

    def read_stdout(self, f: IO[bytes]) -> None:
        for raw in iter(lambda: f.readline(_MAX_LINE), b""):
            line = raw.decode("utf-8", errors="replace")
            is_marker, n = parse_marker(line)
            if is_marker:
                t = time.monotonic() - self.t0
                step = n if n is not None else self._last_step + 1
                self._last_step = step
                with self.lock:
                    self.steps.append((t, step))
                self.on_step(step)
                continue
            with self.lock:
                self.merged.add(line)

    def read_stderr(self, f: IO[bytes]) -> None:
        for raw in iter(lambda: f.readline(_MAX_LINE), b""):
            line = raw.decode("utf-8", errors="replace")
            with self.lock:
                self.merged.add(line)
                self.stderr.add(line)

    def log_tail(self, crashed: bool) -> str:
        with self.lock:
            merged = self.merged.text()
            err = self.stderr.text()
        if not crashed or not err:
            return merged
        err = err[-STDERR_TAIL_BYTES:]
        if err in merged:
            return merged
        # Chatty stdout pushed the traceback out of the merged tail: keep both halves.
        keep = LOG_TAIL_BYTES - len(err) - 40
        head = merged[-keep:] if keep > 0 else ""
        return f"{head}\n[... stderr tail ...]\n{err}"


def _kill_group(pgid: int) -> None:
    if pgid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def _in_child(join_cap: Callable[[], None] | None) -> None:
    """Runs in the forked child before exec: join the memory cap, and die with the runner.

    The script has its own session (so the tree can be killed as a group), which also
    means nothing kills it when the runner is SIGKILLed; PDEATHSIG does.
    """
    if join_cap is not None:
        join_cap()
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def run_script(
    python: str,
    script: Path,
    *,
    cwd: Path,
    timeout_s: float,
    memory_limit_bytes: int | None,
    sample_hz: float = 10.0,
    env: dict[str, str] | None = None,
    gpu: GpuProbe | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    cap_method: CapMethod | None = None,
    name: str | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Execution:
    """Run ``python script`` in ``cwd`` under a memory cap and the sampler.

    ``cap_method`` forces a `MemoryCap` method (tests force "watchdog");
    ``name`` labels the cgroup (default: the script's stem). ``on_start`` is
    called with the child's pid, which is also its process group id, once it
    runs: a runner that loses its lease kills the trial with
    ``os.killpg(pgid, SIGKILL)`` from another thread, and this function then
    returns as for any killed script (after cleaning up the tree and cgroup).
    """
    limit = memory_limit_bytes if memory_limit_bytes is not None else default_limit_bytes()
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")

    with MemoryCap.create(limit, name or Path(script).stem, method=cap_method) as cap:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [python, str(script)],
            cwd=str(cwd),
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=functools.partial(_in_child, cap.preexec if cap.path is not None else None),
        )
        pgid = proc.pid  # session leader: its pid is the group id
        sampler = Sampler(
            proc.pid,
            hz=sample_hz,
            gpu=gpu,
            start_time=t0,
            watchdog_limit_bytes=limit if cap.method == "watchdog" else None,
            on_watchdog=cap.trip,
            on_sample=on_sample,
        )
        out = _Output(t0, sampler.set_step)
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            threading.Thread(target=out.read_stdout, args=(proc.stdout,), daemon=True),
            threading.Thread(target=out.read_stderr, args=(proc.stderr,), daemon=True),
        ]
        for r in readers:
            r.start()
        sampler.start()

        timed_out = False
        try:
            if on_start is not None:
                on_start(pgid)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(pgid)
            sampler.kill_tree()
            proc.wait()
        except BaseException:
            # Interrupted (KeyboardInterrupt, a stale lease...): never leave the tree running.
            _kill_group(pgid)
            sampler.kill_tree()
            proc.wait()
            sampler.stop()
            raise
        duration = time.monotonic() - t0
        sampler.stop()

        # Nothing of the trial survives it: the group, stragglers that left it, the cgroup.
        _kill_group(pgid)
        sampler.kill_tree()
        cap.kill_all()
        for r in readers:
            r.join(timeout=5.0)
        if not any(r.is_alive() for r in readers):
            # (A reader still blocked holds the file's lock: closing would hang; leave it.)
            for f in (proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    f.close()

        exit_code = proc.returncode
        oom = cap.oom_killed(exit_code)
        crashed = exit_code not in (0, 125)
        return Execution(
            exit_code=exit_code,
            oom_killed=oom,
            timed_out=timed_out,
            cap_method=cap.method,
            duration_s=duration,
            log_tail=out.log_tail(crashed),
            samples=list(sampler.samples),
            steps=list(out.steps),
            gpu_source=sampler.gpu_source if gpu is not None else "unavailable",
            host_source="psutil",
            stderr_tail=out.stderr.text()[-STDERR_TAIL_BYTES:],
            memory_limit_bytes=limit,
            peak_rss=sampler.peak_rss,
            cgroup_peak_bytes=cap.peak_bytes(),
            oom_kill_count=cap.oom_kill_count(),
            cap_notes=list(cap.notes),
        )
