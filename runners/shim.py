"""The per-trial supervisor: ``python -I -S shim.py STATUS_FD UID GID NPROC CWD ARGV...``.

Standard library only, and only its C modules, so that it starts in about the time of a
bare interpreter.

`runners.supervise` starts this program inside the trial's cap (the child joins the
cgroups between fork and exec), in its own session, with PR_SET_PDEATHSIG so it dies
with the runner. It is the root of everything the trial runs; its rules:

* It is a child subreaper (PR_SET_CHILD_SUBREAPER): every orphan of the trial (a double
  fork, a ``setsid`` daemon) re-parents to it, never to init, so it stays a descendant,
  is sampled, and is killed at the end.
* It starts ``argv`` as its one direct child, in a process group of its own, with
  PR_SET_PDEATHSIG=SIGKILL (the child dies with the supervisor), RLIMIT_NPROC when
  ``nproc`` is given, and, when ``uid``/``gid`` are given, no supplementary groups and
  that gid and uid (real, effective and saved: the child cannot get root back).
* When the runner is root the supervisor stays root: the trial's uid cannot signal it,
  ptrace it or read its file descriptors. It also sets its own ``oom_score_adj`` to
  -1000 (restored for the child), so an OOM kill in the cgroup never picks it (cgroup v2
  ``memory.oom.group`` spares tasks at -1000).
* It reaps every process that ends up as its child. When the direct child exits it
  SIGKILLs every remaining descendant, again and again, until it has no child left,
  and only then reports.
* SIGTERM, SIGINT or SIGHUP (the runner ending the trial: timeout, lost lease, the
  watchdog) kill the direct child at once; the clean-up above follows.
* Report: lines on STATUS_FD (close-on-exec: the child never holds it): ``pid N`` once
  the child runs, then one of ``exit CODE``, ``signal SIGNUM`` or ``error TEXT`` (the
  command could not be started). The supervisor's own exit status is 0 after a report,
  125 for arguments it cannot use.

UID, GID and NPROC are numbers or ``-`` (none; see `Config`). The supervisor's own
environment is the child's.

`descendants` is also imported by the sampler: it lists a tree through
``/proc/PID/task/TID/children`` (one small read per process of the tree, not a scan of
the machine), falling back to a scan of ``/proc/*/stat`` where the kernel lacks it.
"""

from __future__ import annotations

# The C modules behind ctypes and signal: the public ones import enum, re and struct,
# which costs the supervisor's start (and so every trial's) about 10 ms. (No contextlib
# either, for the same reason.)
import _ctypes
import _signal
import os
import resource  # before any uid change: the runner's interpreter may be unreadable after
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SIGKILL = _signal.SIGKILL
_STOP_SIGNALS = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)


class _Int(_ctypes._SimpleCData):
    _type_ = "i"


class _Function(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Libc:
    _handle = _ctypes.dlopen(None, os.RTLD_NOW)


_prctl = _Function(("prctl", _Libc()))


def prctl(option: int, value: int) -> None:
    if _prctl(option, value, 0, 0, 0) != 0:
        err = _ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


# --------------------------------------------------------------------------- the tree


def _children_files(pid: int) -> list[int] | None:
    """Children of every thread of `pid`; None when the kernel has no children files."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return out


def _ppid_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def children(pid: int) -> list[int]:
    """The direct children of `pid` now."""
    kids = _children_files(pid)
    return kids if kids is not None else _ppid_map().get(pid, [])


def descendants(root: int) -> list[int]:
    """Every descendant of `root` now (not `root` itself), parents before children."""
    out: list[int] = []
    todo = [root]
    ppids: dict[int, list[int]] | None = None
    while todo:
        pid = todo.pop()
        kids = _children_files(pid) if ppids is None else ppids.get(pid, [])
        if kids is None:  # no children files on this kernel: scan once
            ppids = _ppid_map()
            kids = ppids.get(pid, [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _kill(pid: int) -> None:
    try:  # noqa: SIM105
        os.kill(pid, SIGKILL)
    except OSError:
        pass


# --------------------------------------------------------------------------- the child


def _drop_and_exec(cfg: Config, err_w: int, oom_adj: str | None) -> None:
    """In the forked child: own group, restored OOM score, dropped uid, then exec."""
    for sig in _STOP_SIGNALS:
        _signal.signal(sig, _signal.SIG_DFL)
    try:
        parent = os.getppid()
        os.setpgid(0, 0)
        if oom_adj is not None:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(oom_adj)
        if cfg.uid is not None and cfg.gid is not None:
            os.setgroups([])
            os.setresgid(cfg.gid, cfg.gid, cfg.gid)
            os.setresuid(cfg.uid, cfg.uid, cfg.uid)
        # After the uid change: changing credentials clears the parent-death signal.
        prctl(PR_SET_PDEATHSIG, SIGKILL)
        if os.getppid() != parent:
            os._exit(137)  # the supervisor died before PDEATHSIG was armed
        if cfg.nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (cfg.nproc, cfg.nproc))
        os.chdir(cfg.cwd)
        os.execvpe(cfg.argv[0], cfg.argv, os.environ)
    except BaseException as e:  # noqa: BLE001 - anything here means "could not start"
        os.write(err_w, f"cannot start {cfg.argv[0]}: {e}".encode(errors="replace"))
    os._exit(127)


# --------------------------------------------------------------------------- the supervisor


class Config:
    """``STATUS_FD UID GID NPROC CWD ARGV...`` (``-`` for "none"): argv, not JSON, because
    importing json costs the supervisor's start a few milliseconds."""

    def __init__(self, args: list[str]) -> None:
        if len(args) < 6:
            raise ValueError("expected STATUS_FD UID GID NPROC CWD ARGV...")
        fd, uid, gid, nproc, self.cwd, *self.argv = args

        def opt(x: str) -> int | None:
            return None if x == "-" else int(x)

        self.status_fd = int(fd)
        self.uid, self.gid, self.nproc = opt(uid), opt(gid), opt(nproc)

    @staticmethod
    def encode(
        status_fd: int, uid: int | None, gid: int | None, nproc: int | None, cwd: str,
        argv: list[str],
    ) -> list[str]:  # fmt: skip
        def opt(x: int | None) -> str:
            return "-" if x is None else str(x)

        return [str(status_fd), opt(uid), opt(gid), opt(nproc), cwd, *argv]


class Supervisor:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.child: int | None = None
        self.stopping = False

    def send(self, kind: str, value: object) -> None:
        line = f"{kind} {value}".replace("\n", " ") + "\n"
        try:  # noqa: SIM105
            os.write(self.cfg.status_fd, line.encode(errors="replace"))
        except OSError:
            pass  # the runner is gone; PDEATHSIG follows

    def stop(self, _signum: int = 0, _frame: object = None) -> None:
        self.stopping = True
        if self.child is not None:
            _kill(self.child)

    def protect(self) -> str | None:
        """As root: keep the OOM killer off the supervisor; returns the score to restore."""
        if os.geteuid() != 0:
            return None
        try:
            with open("/proc/self/oom_score_adj") as f:
                old = f.read().strip()
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")
        except OSError:
            return None
        return old

    def start(self) -> str | None:
        """Fork and exec the command; the error text when it could not be started."""
        oom_adj = self.protect()
        err_r, err_w = os.pipe()  # close-on-exec: EOF with no data means exec succeeded
        pid = os.fork()
        if pid == 0:
            os.close(err_r)
            _drop_and_exec(self.cfg, err_w, oom_adj)
        self.child = pid
        os.close(err_w)
        if self.stopping:
            _kill(pid)
        chunks = []
        while chunk := os.read(err_r, 4096):
            chunks.append(chunk)
        os.close(err_r)
        return b"".join(chunks).decode(errors="replace") or None

    def wait_child(self) -> int:
        """Reap whatever exits until the direct child does; its wait status."""
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == self.child:
                return status

    def sweep(self) -> None:
        """SIGKILL every descendant and reap until no child is left."""
        me = os.getpid()
        while True:
            for pid in descendants(me):
                _kill(pid)
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return
            while True:  # reap everything already dead before listing again
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid == 0:
                    break

    def run(self) -> int:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        for sig in _STOP_SIGNALS:
            _signal.signal(sig, self.stop)
        error = self.start()
        if error is None:
            self.send("pid", self.child)
        status = self.wait_child()
        self.sweep()
        if error is not None:
            self.send("error", error)
        elif os.WIFSIGNALED(status):
            self.send("signal", os.WTERMSIG(status))
        else:
            self.send("exit", os.WEXITSTATUS(status))
        return 0


def main(args: list[str]) -> int:
    try:
        cfg = Config(args)
        os.set_inheritable(cfg.status_fd, False)
    except (ValueError, OSError) as e:
        os.write(2, f"leakbisect supervisor: bad arguments: {e}\n".encode())
        return 125
    return Supervisor(cfg).run()


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # no interpreter teardown: every report is already written
