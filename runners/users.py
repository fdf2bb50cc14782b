"""Who runs untrusted code on a runner, and whether they can reach a path.

When the runner is root it never runs a job's code as root. Two dedicated system users:

* the **trial user** runs repro scripts: ``BISECT_TRIAL_USER``, default ``leakbisect-trial``;
* the **build user** runs every uv command (``uv venv``, ``uv pip install``, ``uv pip
  compile``, ``uv pip freeze``, ``uv python find``), because installing an sdist runs its
  build backend, which is code from the job too: ``BISECT_BUILD_USER``, default
  ``leakbisect-build``.

Each is created with ``useradd --system`` (own group, no home, no login shell) the first
time it is needed, when missing. Two different users, so that a script cannot write into
an owner's uv cache (the build user's, closed except during that owner's build) and poison
the next build; published environments are root's and read-only (`runners.publish`), out
of reach of both. When the runner is not root, both are None: everything runs as
the runner's own uid (there is nobody else to become).

**One trial user per concurrent trial** (`lease_trial_user`): a trial runs as a user of
a pool, ``<trial user>-0``, ``-1``, ... (``leakbisect-trial-0`` by default), created like
the others, and holds it exclusively for the whole trial, across the threads and the
processes of the host (several runners may share one): slot ``N`` is held by an
exclusive ``flock`` on ``/run/leakbisect/trial-N.lock`` (the directory root's, 0700).
Before a slot is given back, every process still running as its uid is SIGKILLed, so
nothing of one trial lives on into the next trial of that user. Two trials therefore
never share a uid: one cannot read the other's ``/proc/PID/environ``, signal or ptrace
it, or enter its private directories.

`blocked_by` answers "can this user reach this path?" from the permission bits of the
path and of every directory above it (owner, group or other bits, as the kernel checks
them; ACLs are not read), and names the directory that blocks: the pyenv interpreters
under ``/root`` (mode 0700) are the usual case.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from contract.errors import Unavailable

TRIAL_USER_ENV = "BISECT_TRIAL_USER"
BUILD_USER_ENV = "BISECT_BUILD_USER"
DEFAULT_TRIAL_USER = "leakbisect-trial"
DEFAULT_BUILD_USER = "leakbisect-build"

LEASE_DIR = Path("/run/leakbisect")
MAX_TRIAL_SLOTS = 256  # more trials at once than any runner host runs
_LEASE_WAIT_S = 0.05

_create_lock = threading.Lock()


@dataclass(frozen=True)
class Identity:
    """A user untrusted code runs as: no supplementary groups, just ``gid``."""

    name: str
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"user {self.name} (uid {self.uid})"


@dataclass(frozen=True)
class Identities:
    """The trial and build users; both None when the runner is not root."""

    trial: Identity | None
    build: Identity | None

    @property
    def users(self) -> list[Identity]:
        return [i for i in (self.trial, self.build) if i is not None]


def running_as_root() -> bool:
    return os.geteuid() == 0


def ensure_user(name: str) -> Identity:
    """The system user `name`, created with ``useradd --system`` when missing."""
    with _create_lock:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            _useradd(name)
            entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise Unavailable(f"user {name} is root: untrusted code must not run as root")
    return Identity(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def _useradd(name: str) -> None:
    cmd = [
        "useradd", "--system", "--user-group", "--no-create-home",
        "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
        "--comment", "leakbisect untrusted code", name,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"cannot create user {name}: {e}") from None
    if proc.returncode not in (0, 9):  # 9: created meanwhile by another process
        reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no reason"
        raise Unavailable(
            f"cannot create user {name} (useradd exit {proc.returncode}: {reason}); "
            f"create it or set {TRIAL_USER_ENV}/{BUILD_USER_ENV} to an existing user"
        )


def identities() -> Identities:
    """The users untrusted code runs as here (created when missing), None when not root."""
    if not running_as_root():
        return Identities(None, None)
    trial = ensure_user(os.environ.get(TRIAL_USER_ENV) or DEFAULT_TRIAL_USER)
    build = ensure_user(os.environ.get(BUILD_USER_ENV) or DEFAULT_BUILD_USER)
    if trial.uid == build.uid:
        raise Unavailable(
            f"{TRIAL_USER_ENV} and {BUILD_USER_ENV} name the same user ({trial.name}): "
            "a script could then rewrite the environments"
        )
    return Identities(trial, build)


@contextmanager
def lease_trial_user() -> Iterator[Identity | None]:
    """The user one trial runs as, held for the trial (None when the runner is not root).

    Callers run the whole trial (work dir, script, clean-up) inside the ``with``; at its
    end every process of that user is killed and the slot is free again (module docstring).
    """
    if not running_as_root():
        yield None
        return
    base = identities().trial
    assert base is not None
    fd, slot = _take_slot()
    try:
        who = ensure_user(f"{base.name}-{slot}")
        try:
            yield who
        finally:
            kill_user_processes(who.uid)
    finally:
        os.close(fd)  # releases the flock


def _lease_dir() -> Path:
    """`LEASE_DIR`, root's and 0700 (refused otherwise: a user could then steal a slot)."""
    with contextlib.suppress(FileExistsError):
        LEASE_DIR.mkdir(mode=0o700, parents=True)
    st = os.lstat(LEASE_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        raise Unavailable(f"{describe(LEASE_DIR)}: it must be a directory of root's, mode 0700")
    return LEASE_DIR


def _take_slot() -> tuple[int, int]:
    """(the descriptor holding its lock, the slot): the first free slot, waiting for one."""
    top = _lease_dir()
    while True:
        for slot in range(MAX_TRIAL_SLOTS):
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(top / f"trial-{slot}.lock", flags, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd, slot
        time.sleep(_LEASE_WAIT_S)


def processes() -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """(pid, the fields of /proc/PID/status) of every process on the machine; one that
    ends while it is read is left out. The one reading of /proc the runner's accounts of
    processes by uid share."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        yield int(name), dict(ln.split(b":", 1) for ln in lines if b":" in ln)


def _uid_processes(uid: int) -> list[int]:
    """Live processes with `uid` as their real, effective, saved or file-system uid (the
    owner of /proc/PID is not enough: a non-dumpable process shows as root's there)."""
    return [
        pid
        for pid, fields in processes()
        if uid in {int(x) for x in fields.get(b"Uid", b"").split()}
        and not fields.get(b"State", b"").strip().startswith(b"Z")
    ]


def kill_user_processes(uid: int, rounds: int = 100) -> int:
    """SIGKILL every process of `uid` until none is left (a fork in flight is caught by
    the next round); how many were killed."""
    killed = 0
    for _ in range(rounds):
        pids = _uid_processes(uid)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    return killed


# --------------------------------------------------------------------------- reachability


def _bits(st: os.stat_result, who: Identity) -> int:
    """The rwx bits that apply to `who` for a file with this stat (0..7)."""
    if st.st_uid == who.uid:
        return (st.st_mode >> 6) & 7
    if st.st_gid == who.gid:
        return (st.st_mode >> 3) & 7
    return st.st_mode & 7


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def describe(path: Path) -> str:
    """``/root is mode 0700, owner root:root``."""
    st = os.stat(path)
    return (
        f"{path} is mode {stat.S_IMODE(st.st_mode):04o}, "
        f"owner {_owner_name(st.st_uid)}:{_group_name(st.st_gid)}"
    )


def blocked_by(path: Path, who: Identity | None, need: str = "r") -> str | None:
    """Why `who` cannot use `path`, or None when it can.

    ``need`` is what the last component needs: any of ``r``, ``w``, ``x`` (a directory
    to list and enter: ``rx``; to create files in: ``wx``; an interpreter: ``x``). Every
    directory on the way, through symbolic links, needs ``x``. None for `who` None (the
    runner itself) and for a path that does not exist yet (its parent is then checked).
    """
    if who is None:
        return None
    want = (4 if "r" in need else 0) | (2 if "w" in need else 0) | (1 if "x" in need else 0)
    real = Path(os.path.realpath(path))
    for target in dict.fromkeys([Path(os.path.abspath(path)), real]):
        chain = [*reversed(target.parents), target]
        for i, p in enumerate(chain):
            last = i == len(chain) - 1
            try:
                st = os.stat(p)
            except FileNotFoundError:
                return None if last else f"{p} does not exist"
            except OSError as e:
                return f"{p}: {e.strerror}"
            bits = want if last else 1
            if _bits(st, who) & bits != bits:
                return describe(p)
    return None


def require_reachable(path: Path, who: Identity | None, need: str, what: str, fix: str) -> None:
    """Raise `Unavailable` with one line naming the path that blocks and the fix."""
    reason = blocked_by(path, who, need)
    if reason is not None:
        raise Unavailable(f"{what} {path} is not usable by {who}: {reason}; {fix}")
