"""The per-trial supervisor: ``python -I -S shim.py STATUS_FD UID GID NPROC ISOLATE CWD ARGV...``.

Standard library only, and only its C modules, so that it starts in about the time of a
bare interpreter.

`runners.supervise` starts this program inside the trial's cap (the child joins the
cgroups between fork and exec), in its own session, with PR_SET_PDEATHSIG so it dies
with the runner. It is the root of everything the trial runs; its rules:

* It is a child subreaper (PR_SET_CHILD_SUBREAPER): every orphan of the trial (a double
  fork, a ``setsid`` daemon) re-parents to it (or, in a PID namespace, to the namespace's
  `Init`, its child), never to the host's init, so it stays a descendant, is sampled, and
  is killed at the end.
* It starts ``argv`` (directly, or under an `Init`: see Isolation) in a process group of
  its own, with PR_SET_PDEATHSIG=SIGKILL (the command dies with its parent),
  RLIMIT_NPROC when ``nproc`` is given, and, when ``uid``/``gid`` are given, no
  supplementary groups and that gid and uid (real, effective and saved: the command
  cannot get root back).
* When the runner is root the supervisor (and the init) stay root: the trial's uid cannot
  signal them, ptrace them or read their file descriptors. It also sets its own
  ``oom_score_adj`` to -1000 (restored for the command), so an OOM kill in the cgroup
  never picks it (cgroup v2 ``memory.oom.group`` spares tasks at -1000).
* It reaps every process that ends up as its child. When its direct child exits it
  SIGKILLs every remaining descendant, again and again, until it has no child left,
  and only then reports.
* SIGTERM, SIGINT or SIGHUP (the runner ending the trial: timeout, lost lease, the
  watchdog) SIGKILL its direct child at once (the command, or the init and with it the
  whole namespace); the clean-up above follows.
* Report: lines on STATUS_FD (close-on-exec: the command never holds it): ``init N`` for
  an isolated command, right after the fork (the init's host pid, ``-`` for none: the
  runner waits for it and its sampler leaves the init out), ``missing PHRASE`` for each
  protection it could not get, ``pid N`` (the command's host pid), then one of ``exit
  CODE``, ``signal SIGNUM`` (the command's own status, exactly as without a namespace)
  or ``error TEXT`` (the command could not be started). The supervisor's own exit status
  is 0 after a report, 125 for arguments it cannot use. The command's side talks to the
  supervisor over a control pipe of its own (``pid``, ``error``, the init's ``status``),
  closed at exec.

UID, GID and NPROC are numbers or ``-`` (none; see `Config`). The supervisor's own
environment is the command's.

**Isolation** (ISOLATE ``ns``; ``-`` for none: uv commands, which need the network): the
supervisor asks for a new PID namespace, whose pid 1 is an `Init` (a fork of the
supervisor) that runs the command as pid 2: the command sees only its own tree (other
trials' processes do not exist for it), ends by its own signals as anywhere else, and its
orphans are reaped; when it exits the kernel kills everything left in the namespace. Its
processes are still the supervisor's descendants, seen by their host pids by the sampler,
the cgroup and every kill. The init, still root, unshares a mount, a network and an IPC
namespace and mounts, in its own mount namespace only: a ``/proc`` of its PID namespace,
a fresh tmpfs on ``/dev/shm``, and a fresh tmpfs on ``/tmp`` into which it binds back its
working directory's top-level ``/tmp`` entry and the host ``/tmp`` directories it could
enter anyway and no other user can write (root's, not group- or world-writable:
environments or test fixtures kept under ``/tmp``); nothing a trial writes to ``/tmp``
reaches another. Its network namespace has only a loopback of its own (brought up): the
host's ports (a local Postgres) and every other network are unreachable. Every step that
the kernel or the rights refuse is reported as ``missing PHRASE`` (`PROTECTIONS`), and the
command runs without it; without a PID namespace there is no init and the command itself
tries the other namespaces.

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
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x8000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH = 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
# What a trial may lack, one phrase each: the supervisor reports them as ``missing PHRASE``
# and the runner copies them into the trial's report (`TrialReport.missing_protections`).
NO_PID_NS = "no PID namespace (other processes visible in /proc)"
NO_PRIVATE_TMP = "no private /tmp and /dev/shm"
NO_NET_NS = "no network namespace (the host's network reachable)"
PROTECTIONS = (NO_PID_NS, NO_PRIVATE_TMP, NO_NET_NS)
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
_unshare = _Function(("unshare", _Libc()))
_mount = _Function(("mount", _Libc()))
_umount2 = _Function(("umount2", _Libc()))


def _check(result: int, what: str) -> None:
    if result != 0:
        err = _ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, value: int) -> None:
    _check(_prctl(option, value, 0, 0, 0), f"prctl({option})")


def unshare(flags: int) -> None:
    _check(_unshare(flags), f"unshare({flags:#x})")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    def c(x: str | None) -> bytes | None:
        return None if x is None else os.fsencode(x)

    _check(_mount(c(source), c(target), c(fstype), flags, c(data)), f"mount {target}")


def umount(target: str) -> None:
    _check(_umount2(os.fsencode(target), MNT_DETACH), f"umount {target}")


# --------------------------------------------------------------------------- isolation


def _kept_tmp_entries(cwd: str, uid: int | None) -> list[tuple[str, int]]:
    """(name, O_PATH fd) of the host /tmp entries a private /tmp binds back: the top-level
    entry holding `cwd` first (an `OSError` when it cannot be opened: the trial cannot run
    without it), then directories `uid` could enter that only root can write."""
    own = cwd.split("/")[2] if cwd.startswith("/tmp/") else None
    kept = []
    if own is not None:
        kept.append((own, os.open(f"/tmp/{own}", os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)))
    for name in os.listdir("/tmp"):
        if name == own:
            continue
        try:
            fd = os.open(f"/tmp/{name}", os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
        except OSError:
            continue  # a file, a link, gone: not bound back
        st = os.fstat(fd)
        mode = st.st_mode & 0o7777
        if st.st_uid == 0 and not mode & 0o022 and (not uid or mode & 0o001):
            kept.append((name, fd))
        else:
            os.close(fd)
    return kept


def _private_tmp(cwd: str, uid: int | None) -> None:
    """Fresh tmpfs on /tmp and /dev/shm in this mount namespace, with `_kept_tmp_entries`
    bound back (through /proc/self/fd: the host's /tmp is covered by then). A shared entry
    removed meanwhile (another trial's or test's directory, deleted between the listing and
    its bind) is left out; the trial's own entry must bind, or /tmp is uncovered again and
    the `OSError` says no private /tmp."""
    kept = _kept_tmp_entries(cwd, uid)
    try:
        flags = MS_NOSUID | MS_NODEV
        mount("tmpfs", "/dev/shm", "tmpfs", flags, "mode=1777")
        mount("tmpfs", "/tmp", "tmpfs", flags, "mode=1777")
        own = cwd.startswith("/tmp/")
        for i, (name, fd) in enumerate(kept):
            try:
                _bind_back(name, fd)
            except OSError:
                if i == 0 and own:
                    umount("/tmp")
                    umount("/dev/shm")
                    raise
    finally:
        for _, fd in kept:
            os.close(fd)


def _bind_back(name: str, fd: int) -> None:
    os.mkdir(f"/tmp/{name}", 0o700)
    try:
        mount(f"/proc/self/fd/{fd}", f"/tmp/{name}", None, MS_BIND | MS_REC)
    except OSError:
        os.rmdir(f"/tmp/{name}")
        raise


def _loopback_up() -> None:
    """The new network namespace's own loopback, up (the script may serve itself)."""
    import _socket  # only here: C modules, imported only by isolated trials
    import fcntl

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        req = b"lo".ljust(16, b"\0") + IFF_UP.to_bytes(2, sys.byteorder) + bytes(22)
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, req)
    finally:
        sock.close()


def isolate_child(cwd: str, uid: int | None, pid_ns: bool) -> list[str]:
    """In the child, as root, before the uid drop: the namespaces of the module docstring.
    Returns the phrases of `PROTECTIONS` it could not get."""
    missing = [] if pid_ns else [NO_PID_NS]
    try:
        unshare(CLONE_NEWNS | CLONE_NEWIPC)
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below leaks to the host
        if pid_ns:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _private_tmp(cwd, uid)
    except OSError:
        missing = [NO_PID_NS, NO_PRIVATE_TMP]  # the host's /proc shows every process
    try:
        unshare(CLONE_NEWNET)
    except OSError:
        missing.append(NO_NET_NS)
    else:
        try:  # noqa: SIM105
            _loopback_up()
        except OSError:
            pass  # a loopback that stays down: still no network
    return [p for p in PROTECTIONS if p in missing]


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
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
            try:  # os.read: a re-listing reads these many times a second
                text = b"".join(iter(lambda: os.read(fd, 65536), b""))  # noqa: B023
            finally:
                os.close(fd)
            out.extend(int(x) for x in text.split())
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


def _host_pid(host_proc: int | None) -> int:
    """This process's pid on the host: through the host's /proc (opened before a PID
    namespace's own /proc covered it), else its own (no namespace: the same)."""
    if host_proc is None:
        return os.getpid()
    return int(os.readlink("self", dir_fd=host_proc))


def _drop_and_exec(
    cfg: Config, ctl_w: int, oom_adj: str | None, isolate: bool, host_proc: int | None
) -> None:
    """In the forked child: own group, restored OOM score, isolation when `isolate` (its
    parent, the init, did it otherwise), dropped uid, ``pid HOSTPID`` on `ctl_w`, exec;
    ``error TEXT`` on `ctl_w` when any of it fails."""
    for sig in _STOP_SIGNALS:
        _signal.signal(sig, _signal.SIG_DFL)
    try:
        parent = os.getppid()  # the supervisor, or the init (pid 1 of the namespace)
        os.setpgid(0, 0)
        if isolate:
            for phrase in isolate_child(cfg.cwd, cfg.uid, False):
                os.write(cfg.status_fd, f"missing {phrase}\n".encode())
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
            os._exit(137)  # the parent died before PDEATHSIG was armed
        if cfg.nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (cfg.nproc, cfg.nproc))
        os.chdir(cfg.cwd)
        os.write(ctl_w, f"pid {_host_pid(host_proc)}\n".encode())
        os.execvpe(cfg.argv[0], cfg.argv, os.environ)
    except BaseException as e:  # noqa: BLE001 - anything here means "could not start"
        text = f"error cannot start {cfg.argv[0]}: {e}".replace("\n", " ")
        os.write(ctl_w, text.encode(errors="replace") + b"\n")
    os._exit(127)


# --------------------------------------------------------------------------- the init


class Init:
    """Pid 1 of the trial's PID namespace: the supervisor's child, which runs the command.

    A namespace's pid 1 gets no signal from inside it that it has no handler for (not
    even SIGKILL: ``os.kill(os.getpid(), SIGTERM)`` would do nothing), and every orphan of
    the namespace is re-parented to it; a script there would never end itself by a signal
    and never reap its orphans' zombies (each counts against the pids limit). So pid 1
    is this init, a fork of the supervisor (no exec: Python is loaded), still root:

    * it sets PR_SET_PDEATHSIG (it dies with the supervisor) and sets up the namespaces
      (`isolate_child`: its /proc, private /tmp and /dev/shm, network), reporting
      ``missing PHRASE`` lines itself;
    * it forks the command (pid 2 of the namespace: `_drop_and_exec`, which writes its
      host pid on the control pipe) and forwards SIGTERM, SIGINT and SIGHUP to it;
    * it reaps every process that ends up as its child until the command exits, then
      writes ``status WAITSTATUS`` (the command's own: an exit code or the signal that
      ended it) on the control pipe and exits (with the exit code, or 128 + the signal:
      a pid 1 cannot die of its own signal). Its exit makes the kernel SIGKILL and reap
      everything left in the namespace before the supervisor sees it exit.

    Its own memory is not the trial's: the supervisor reports its host pid (``init N``)
    and the runner's sampler leaves it out. The trial's uid cannot signal it (root's).
    """

    def __init__(self, cfg: Config, ctl_w: int, oom_adj: str | None, supervisor: int) -> None:
        self.cfg = cfg
        self.ctl_w = ctl_w
        self.oom_adj = oom_adj
        self.supervisor = supervisor
        self.child: int | None = None
        self.pending: list[int] = []

    def forward(self, signum: int, _frame: object = None) -> None:
        if self.child is None:
            self.pending.append(signum)
            return
        try:  # noqa: SIM105
            os.kill(self.child, signum)
        except OSError:
            pass  # already reaped

    def arm(self, host_proc: int) -> None:
        """Die with the supervisor; exit at once when it is already gone (the host's /proc:
        in the namespace getppid() is 0 whoever the parent is)."""
        prctl(PR_SET_PDEATHSIG, SIGKILL)
        with open(os.open("self/stat", os.O_RDONLY, dir_fd=host_proc), "rb") as f:
            ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        if ppid != self.supervisor:
            os._exit(137)

    def run(self) -> None:
        for sig in _STOP_SIGNALS:
            _signal.signal(sig, self.forward)
        try:
            self.start()
        except BaseException as e:  # noqa: BLE001 - the command never ran
            text = f"error cannot start {self.cfg.argv[0]}: {e}".replace("\n", " ")
            os.write(self.ctl_w, text.encode(errors="replace") + b"\n")
            os._exit(127)
        for sig in self.pending:
            self.forward(sig)
        status = self.reap()
        os.write(self.ctl_w, f"status {status}\n".encode())
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))

    def start(self) -> None:
        """Arm, isolate, fork the command."""
        host_proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
        self.arm(host_proc)
        for phrase in isolate_child(self.cfg.cwd, self.cfg.uid, True):
            os.write(self.cfg.status_fd, f"missing {phrase}\n".encode())
        pid = os.fork()
        if pid == 0:
            _drop_and_exec(self.cfg, self.ctl_w, self.oom_adj, False, host_proc)
        self.child = pid
        os.close(host_proc)

    def reap(self) -> int:
        """Reap every child until the command exits; its wait status."""
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == self.child:
                return status


class Config:
    """``STATUS_FD UID GID NPROC ISOLATE CWD ARGV...`` (``-`` for "none"; ISOLATE ``ns`` or
    ``-``): argv, not JSON, because importing json costs the supervisor's start a few
    milliseconds."""

    def __init__(self, args: list[str]) -> None:
        if len(args) < 7:
            raise ValueError("expected STATUS_FD UID GID NPROC ISOLATE CWD ARGV...")
        fd, uid, gid, nproc, isolate, self.cwd, *self.argv = args
        if isolate not in ("ns", "-"):
            raise ValueError(f"ISOLATE is ns or -, not {isolate!r}")

        def opt(x: str) -> int | None:
            return None if x == "-" else int(x)

        self.status_fd = int(fd)
        self.uid, self.gid, self.nproc = opt(uid), opt(gid), opt(nproc)
        self.isolate = isolate == "ns"

    @staticmethod
    def encode(
        status_fd: int, uid: int | None, gid: int | None, nproc: int | None, cwd: str,
        argv: list[str], isolate: bool = False,
    ) -> list[str]:  # fmt: skip
        def opt(x: int | None) -> str:
            return "-" if x is None else str(x)

        flag = "ns" if isolate else "-"
        return [str(status_fd), opt(uid), opt(gid), opt(nproc), flag, cwd, *argv]


class Supervisor:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.child: int | None = None
        self.stopping = False
        self.ctl: int | None = None

    def send(self, kind: str, value: object) -> None:
        line = f"{kind} {value}".replace("\n", " ") + "\n"
        try:  # noqa: SIM105
            os.write(self.cfg.status_fd, line.encode(errors="replace"))
        except OSError:
            pass  # the runner is gone; PDEATHSIG follows

    def stop(self, _signum: int = 0, _frame: object = None) -> None:
        self.stopping = True
        if self.child is not None:
            _kill(self.child)  # the init: the kernel then kills its whole namespace

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

    def new_pid_namespace(self) -> bool:
        """For an isolated command: its PID namespace (the next fork's child, the `Init`,
        is its pid 1); whether the kernel gave it."""
        if not self.cfg.isolate:
            return False
        try:
            unshare(CLONE_NEWPID)
        except OSError:
            return False
        return True

    def start(self) -> None:
        """Fork the init (with a PID namespace) or the command itself (without)."""
        oom_adj = self.protect()
        pid_ns = self.new_pid_namespace()
        ctl_r, ctl_w = os.pipe()  # close-on-exec: only our own code before exec writes it
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(ctl_r)
            if pid_ns:
                Init(self.cfg, ctl_w, oom_adj, me).run()
            _drop_and_exec(self.cfg, ctl_w, oom_adj, self.cfg.isolate, None)
        self.child = pid
        os.close(ctl_w)
        self.ctl = ctl_r
        if self.cfg.isolate:  # the runner waits for this line to leave the init unsampled
            self.send("init", pid if pid_ns else "-")
        if self.stopping:
            _kill(pid)

    def control(self) -> dict[str, str]:
        """What the command's side wrote on the control pipe (it is closed by then):
        ``pid``, ``error`` and, from an init, ``status``."""
        assert self.ctl is not None
        chunks = []
        while chunk := os.read(self.ctl, 4096):
            chunks.append(chunk)
        os.close(self.ctl)
        lines = b"".join(chunks).decode(errors="replace").splitlines()
        return {kind: value for kind, _, value in (ln.partition(" ") for ln in lines)}

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
        self.start()
        status = self.wait_child()
        self.sweep()
        ctl = self.control()
        # An init reports the command's own status; without it (SIGKILLed: a stop, the
        # watchdog) its own death is the command's, as the kernel killed it with it.
        if ctl.get("status", "").isdigit():
            status = int(ctl["status"])
        if "error" in ctl:
            self.send("error", ctl["error"])
            return 0
        if ctl.get("pid", "").isdigit():
            self.send("pid", ctl["pid"])
        if os.WIFSIGNALED(status):
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
