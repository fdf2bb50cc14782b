"""Untrusted commands under the per-trial supervisor (`runners.shim`), from the runner's side.

Every repro script and every uv command is started the same way: the runner starts the
supervisor (``sys.executable -I -S runners/shim.py``: no site, no user paths, about
10 ms), in a new session, with PR_SET_PDEATHSIG=SIGKILL (it dies with the runner's thread
that started it) and, for a trial, inside the trial's cgroups (``join``, run between fork
and exec). The supervisor drops to the trial's or build's uid, runs the command as its
child, reaps every orphan, kills what is left when the command ends, and reports the
command's exact status over a pipe. The runner talks to it through `Supervised`:

* `Supervised.stop` asks it to end the command now (SIGTERM: it kills the command and
  everything under it, then reports, usually within milliseconds);
* `Supervised.outcome` reads the report once it exited: ``exit_code`` is the command's
  own status, ``-signum`` for a signal death; ``error`` says why the command could not
  be started; ``missing`` lists the isolation (``isolate=True``: the namespaces of
  `runners.shim`) the kernel or the runner's rights refused. A supervisor that died
  without a report (SIGKILLed: a cgroup v2 OOM group kill of a non-root runner, or a
  same-uid script) yields its own status instead (``reported`` False).
* ``init_pid`` (``isolate=True``, read by `Supervised.start`): the host pid of the PID
  namespace's init (`runners.shim.Init`), the supervisor's child that runs the command
  as pid 2; its memory is not the trial's, so the sampler leaves it out.

`run` is `subprocess.run` for uv commands: output captured, a timeout that stops the
whole tree (exit 124, as the environment builder expects).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from runners.shim import Config
from runners.users import Identity

SHIM = Path(__file__).resolve().with_name("shim.py")
_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0  # how long a stopped supervisor may take before it is SIGKILLed


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None
    error: str | None = None
    pid: int | None = None  # the command's own pid (the host's), once it ran
    missing: tuple[str, ...] = ()  # isolation asked for and not had (`runners.shim.PROTECTIONS`)
    reported: bool = True  # False: the supervisor died without a report (its own status)


def _in_child(join: Callable[[], None] | None) -> None:
    """Between fork and exec of the supervisor: join the cap, die with the runner."""
    if join is not None:
        join()
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Supervised:
    """One command under the supervisor; `start` it, then `wait` and read `outcome`."""

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        run_as: Identity | None,
        nproc: int | None = None,
        join: Callable[[], None] | None = None,
        isolate: bool = False,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self.isolate = isolate
        self.cwd = Path(cwd)
        self.env = env
        self.run_as = run_as
        self.nproc = nproc
        self.join = join
        self.proc: subprocess.Popen[bytes] | None = None
        self._status_r: int | None = None
        self._early: list[bytes] = []  # status bytes read before the end (`_read_init`)
        self._outcome: Outcome | None = None
        self.init_pid: int | None = None

    def start(self, *, stdout: int | IO[Any] = subprocess.PIPE) -> subprocess.Popen[bytes]:
        status_r, status_w = os.pipe()
        who = self.run_as
        args = Config.encode(
            status_w, who and who.uid, who and who.gid, self.nproc, str(self.cwd), self.argv,
            isolate=self.isolate,
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SHIM), *args],
                cwd="/",
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(status_w,),
                preexec_fn=functools.partial(_in_child, self.join),
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        self._status_r = status_r
        if self.isolate:
            self.init_pid = self._read_init()
        return self.proc

    def _read_init(self) -> int | None:
        """The ``init N`` line (the supervisor writes it right after its fork): the host pid
        of the PID namespace's init, which is not the command (None: no namespace, or the
        supervisor died first). What else was read is kept for `outcome`."""
        assert self._status_r is not None
        data = b""
        while True:
            for line in data.split(b"\n")[:-1]:
                if line.startswith(b"init "):
                    value = line[5:].strip()
                    return int(value) if value.isdigit() else None
            chunk = os.read(self._status_r, 4096)
            if not chunk:
                return None
            self._early.append(chunk)
            data += chunk

    @property
    def pid(self) -> int:
        """The supervisor's pid, which is also its process group and session id."""
        assert self.proc is not None
        return self.proc.pid

    def _signal(self, sig: int) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """End the command and everything under it (safe from any thread, and repeatable)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the supervisor itself: a last resort, its orphans go to the runner."""
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float | None) -> bool:
        """Wait for the supervisor to exit; False when `timeout` passed first.

        Waits on a pidfd where the kernel has them, so the exit is seen at once
        (`Popen.wait` with a timeout polls, with sleeps of up to 50 ms).
        """
        assert self.proc is not None
        if self.proc.returncode is not None:
            return True
        try:
            fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            try:
                ready, _, _ = select.select([fd], [], [], timeout)
            finally:
                os.close(fd)
            if not ready:
                return False
        try:
            self.proc.wait(None if fd is not None else timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def wait_stopped(self) -> None:
        """After `stop`: wait for the supervisor, SIGKILLing it past `STOP_GRACE_S`."""
        assert self.proc is not None
        if not self.wait(STOP_GRACE_S):
            self.kill()
            self.proc.wait()

    def outcome(self) -> Outcome:
        """The command's status, once the supervisor has exited."""
        if self._outcome is not None:
            return self._outcome
        assert self.proc is not None and self.proc.returncode is not None
        lines = self._read_status()
        report = dict(lines)
        pid = int(report["pid"]) if report.get("pid", "").isdigit() else None
        missing = tuple(value for kind, value in lines if kind == "missing")
        if report.get("exit", "").isdigit():
            out = Outcome(int(report["exit"]), pid=pid)
        elif report.get("signal", "").isdigit():
            out = Outcome(-int(report["signal"]), pid=pid)
        elif "error" in report:
            out = Outcome(None, error=report["error"], pid=pid)
        else:  # no report: the supervisor itself was killed
            out = Outcome(self.proc.returncode, pid=pid, reported=False)
        out = dataclasses.replace(out, missing=missing)
        self._outcome = out
        return out

    def _read_status(self) -> list[tuple[str, str]]:
        if self._status_r is None:
            return []
        chunks = self._early
        try:
            while chunk := os.read(self._status_r, 65536):
                chunks.append(chunk)
        finally:
            os.close(self._status_r)
            self._status_r = None
        lines = b"".join(chunks).decode(errors="replace").splitlines()
        return [(kind, value) for kind, _, value in (ln.partition(" ") for ln in lines)]

    def close(self) -> None:
        if self._status_r is not None:
            os.close(self._status_r)
            self._status_r = None


def run(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    run_as: Identity | None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to completion under the supervisor, output captured as text.

    Past `timeout` the whole tree is stopped and the result has exit status 124 and
    ``error: <cmd> timed out after N s`` as its stderr. A command that cannot be started
    has status 127 and the reason as its stderr.
    """
    sup = Supervised(argv, cwd=cwd, env=env, run_as=run_as)
    proc = sup.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        sup.stop()
        sup.wait_stopped()
        sup.close()
        what = " ".join(argv[1:3]) if len(argv) > 2 else argv[0]
        message = f"error: {what} timed out after {timeout:.0f} s"
        return subprocess.CompletedProcess(argv, 124, "", message)
    except BaseException:
        sup.stop()
        sup.wait_stopped()
        sup.close()
        raise
    result = sup.outcome()
    stdout = out.decode(errors="replace")
    stderr = err.decode(errors="replace")
    if result.error is not None:
        return subprocess.CompletedProcess(argv, 127, stdout, f"error: {result.error}\n{stderr}")
    return subprocess.CompletedProcess(argv, result.exit_code or 0, stdout, stderr)
