"""One git command bounded like a trial: the supervisor, a cgroup, a deadline, a byte cap.

A repository a job names is untrusted input, and so is the server behind its URL. Every
git command a commits listing runs (`runners.commits`) goes through `run`:

* It runs under the trial supervisor (`runners.supervise.Supervised`: a child subreaper
  that kills and reaps the whole tree, PR_SET_PDEATHSIG to the runner) inside a
  `runners.limits.MemoryCap` of its own (cgroup v2 or v1: `MEMORY_BYTES` of memory,
  `PIDS` tasks; where the runner cannot make a cgroup there is no memory or process cap,
  and the deadline still holds), as ``run_as`` (the build user when the runner is root).
* Past ``timeout`` the supervisor is stopped: it SIGKILLs git, ``git-remote-https``,
  ``index-pack`` and anything else under it, reaps them all, then exits; the runner
  reaps the supervisor and removes the cgroup (killing whatever is still in it). No
  process of the command outlives `run`, and none is left a zombie.
* A fetching command (``fetch`` given) gets RLIMIT_FSIZE = ``fetch.max_bytes`` (no file
  it writes, the pack being received included, grows past the cap: the write fails with
  EFBIG, SIGXFSZ is ignored) and the directory it writes into is measured every
  `POLL_S`: more than ``fetch.max_bytes`` added stops the tree. `Done.over_cap` says so.
* git's own standard output is kept up to `MAX_OUTPUT` bytes (more stops the tree:
  `Done.over_output`), its standard error's last `STDERR_TAIL` bytes.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from runners.limits import MemoryCap
from runners.supervise import Supervised
from runners.users import Identity

MEMORY_BYTES = 2 << 30  # index-pack of a large history's commits and trees fits
PIDS = 256  # git, its remote helper, index-pack, rev-list: a handful
POLL_S = 0.1  # how often a fetch's directory is measured and the deadline checked
MAX_OUTPUT = 64 << 20  # rev-list of `MAX_COMMITS` commits is well under 1 MiB
STDERR_TAIL = 64 << 10
_TOO_LARGE = os.strerror(27)  # EFBIG, "File too large": a write past RLIMIT_FSIZE


@dataclass(frozen=True)
class Fetch:
    """What bounds a fetching command: the directory it writes into and how much it may add."""

    watch: Path
    max_bytes: int


@dataclass(frozen=True)
class Done:
    """How one command ended. ``exit_code`` is None when git could not be started."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    over_cap: bool = False
    over_output: bool = False
    error: str | None = None  # why git could not be started


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under `path` (0 when it is missing); never follows
    a link, so a tree another user writes cannot point the count elsewhere."""
    total = 0
    with contextlib.suppress(OSError):
        for _, _, files, dirfd in os.fwalk(path, follow_symlinks=False):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_size
    return total


class _Reader(threading.Thread):
    """Drains one pipe, keeping at most `keep` bytes (the head, or the tail)."""

    def __init__(self, pipe: IO[bytes], keep: int, *, tail: bool) -> None:
        super().__init__(daemon=True)
        self.pipe, self.keep, self.tail = pipe, keep, tail
        self.data = bytearray()
        self.overflow = False

    def run(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := self.pipe.read1(65536):
                self.data += chunk
                if len(self.data) > self.keep:
                    self.overflow = True
                    if self.tail:
                        del self.data[: len(self.data) - self.keep]
                    else:
                        del self.data[self.keep :]

    def text(self) -> str:
        return self.data.decode(errors="replace")


def _join(cap: MemoryCap, max_bytes: int | None) -> None:
    """Between fork and exec of the supervisor: the cgroup, then the file-size limit."""
    if cap.dirs:
        cap.preexec()
    if max_bytes is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, which git reports
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


def _watch(sup: Supervised, deadline: float, over: Callable[[], str | None]) -> str | None:
    """Wait for the supervisor; the reason it must be stopped ("timeout", "cap", ...)."""
    while True:
        left = deadline - time.monotonic()
        if sup.wait(max(min(POLL_S, left), 0.0)):
            return None
        if time.monotonic() >= deadline:
            return "timeout"
        why = over()
        if why is not None:
            return why


def run(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    run_as: Identity | None,
    timeout: float,
    fetch: Fetch | None = None,
) -> Done:
    """``git ARGS`` to completion, the deadline or a cap, whichever comes first."""
    # An absolute path: the supervisor's child, once it is the build user, may not read
    # the runner's Python library that a PATH search would import.
    git = shutil.which("git", path=env.get("PATH"))
    if git is None:
        return Done(None, "", "", error="git: No such file or directory")
    cap = MemoryCap.create(MEMORY_BYTES, "git", pids_limit=PIDS)
    sup = Supervised([git, *args], cwd=cwd, env=env, run_as=run_as,
                     join=lambda: _join(cap, fetch and fetch.max_bytes))  # fmt: skip
    why: str | None = None
    try:
        proc = sup.start()
        assert proc.stdout is not None and proc.stderr is not None
        out = _Reader(proc.stdout, MAX_OUTPUT, tail=False)
        err = _Reader(proc.stderr, STDERR_TAIL, tail=True)
        out.start()
        err.start()
        base = tree_bytes(fetch.watch) if fetch else 0

        def over() -> str | None:
            if out.overflow:
                return "output"
            if fetch is not None and tree_bytes(fetch.watch) - base > fetch.max_bytes:
                return "cap"
            return None

        why = _watch(sup, time.monotonic() + timeout, over)
    finally:
        if sup.proc is not None and sup.proc.returncode is None:
            sup.stop()
            sup.wait_stopped()
        cap.close()  # anything that left the supervisor's tree but not the cgroup
    for reader in (out, err):
        reader.join(timeout=5.0)
        if not reader.is_alive():  # (one still blocked holds the file's lock: leave it)
            reader.pipe.close()
    outcome = sup.outcome()
    sup.close()
    stderr = err.text()
    return Done(
        exit_code=None if outcome.error is not None else outcome.exit_code,
        stdout=out.text(),
        stderr=stderr,
        timed_out=why == "timeout",
        over_cap=why == "cap" or (fetch is not None and _TOO_LARGE in stderr),
        over_output=why == "output" or out.overflow,
        error=outcome.error,
    )
