"""A hard memory cap, and a process-count cap, for one trial's process tree.

Every trial runs under a cap so that a leaking release never takes the runner
(or the machine) down. Three mechanisms, tried in this order by
`MemoryCap.create`:

``cgroup-v2``
    A child cgroup of the runner's own cgroup in the unified hierarchy with
    ``memory.max`` = limit, ``memory.swap.max`` = 0 (swap cannot dodge the cap)
    and ``memory.oom.group`` = 1 (an OOM kill takes the whole trial, not one
    worker), and ``pids.max`` = the pids limit in the same cgroup. Needs the
    memory controller in the runner's cgroup ``cgroup.controllers``; if it is
    not yet in ``cgroup.subtree_control`` we try to enable it (and pids), which
    the kernel refuses (EBUSY) when the runner's cgroup itself holds processes
    and is not the root of its namespace; then we fall back. Without the pids
    controller the cap still holds memory and says so in its notes. OOM kills
    are counted by ``memory.events`` ``oom_kill``.
``cgroup-v1``
    A child of the runner's own *memory* cgroup (``/proc/self/cgroup`` line
    ``N:memory:/path``, mount found in ``/proc/self/mountinfo``) with
    ``memory.limit_in_bytes`` and, when the kernel accounts swap,
    ``memory.memsw.limit_in_bytes`` at the same value; and a child of the
    runner's own cgroup in the *pids* hierarchy with ``pids.max``. The trial
    joins both. OOM kills are counted by ``memory.oom_control`` ``oom_kill``
    (kernel >= 4.13); on older kernels we fall back to ``memory.failcnt`` > 0
    together with a SIGKILL exit. Unlike v2 the kernel kills only the largest
    task, not the whole tree.
``enclosing``
    The cgroup the runner itself is in, capped by someone else: the Slurm job's
    allocation (`runners.slurm`: ``--mem`` under ``task/cgroup`` with
    ``ConstrainRAMSpace``). Nothing is created or written: the script runs in that
    cgroup, so the kernel's OOM kill is one Slurm sees and reports as OUT_OF_MEMORY,
    and no second cap fights Slurm's. The limit is the smallest ``memory.max`` /
    ``memory.limit_in_bytes`` on the cgroup and its ancestors (`CapError` when there is
    none: a trial never runs uncapped); OOM kills are the cgroup's ``oom_kill`` counter
    less its value when the cap was taken. The processes already in the cgroup then
    (the runner itself, Slurm's batch shell) are never the trial's: never sampled,
    never killed. Processes are held by RLIMIT_NPROC as under the watchdog.
``watchdog``
    No kernel help: the sampler compares the tree's RSS against the limit at
    every sample and kills the whole tree, then calls `trip()`. A leak faster
    than (limit headroom x sample rate) can overshoot briefly. The process count
    is held by RLIMIT_NPROC on the trial's uid (set by the supervisor) and by
    the sampler, which kills a tree larger than the limit.

The pids limit (`DEFAULT_PIDS_LIMIT`, 4096 tasks: processes and threads) is what
stops a fork bomb; ``pids_limit=None`` turns it off. ``pids.events`` ``max``
counts the forks it refused (`forks_refused`).

The cgroup directories are created by the runner, so when the runner is root
their files are root's: a script running as the trial's uid cannot write any
``cgroup.procs`` and so cannot move itself out (the kernel also requires write
access to the common ancestor). The sampler checks it anyway: a process of the
trial found outside the trial's memory cgroup is killed (`memory_pids`).

A runner that is SIGKILLed cannot remove its trial's cgroups; the next `create` on the
machine does (`remove_stale`: cgroups named for a runner pid that is no longer alive).

The child joins the cgroups in `preexec()` (run by ``Popen(preexec_fn=...)``
between fork and exec), so it is capped before it allocates anything.

All paths are discovered from ``<root>/proc/self/cgroup`` and
``<root>/proc/self/mountinfo`` and resolved under ``<root>``; tests pass a
temporary directory as ``root`` holding a fake cgroupfs (and patch `_mkdir` /
`_rmdir`, which stand for the kernel's behaviour on cgroupfs).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from contract.errors import Unavailable

CapMethod = Literal["cgroup-v1", "cgroup-v2", "enclosing", "watchdog"]
METHODS: tuple[CapMethod, ...] = ("cgroup-v2", "cgroup-v1", "watchdog")

# Fraction of the machine's available memory used when a job sets no cap.
DEFAULT_CAP_FRACTION = 0.8
# Processes (and threads: the kernel counts tasks) one trial may have at once.
DEFAULT_PIDS_LIMIT = 4096

_counter = itertools.count(1)


class CapError(Unavailable):
    """A requested cap method cannot be set up here."""


# Indirections for the two operations whose cgroupfs semantics differ from a
# plain filesystem (mkdir populates control files, rmdir removes a directory
# full of them). Tests replace these to emulate the kernel on a temp tree.
def _mkdir(path: Path) -> None:
    os.mkdir(path)


def _rmdir(path: Path) -> None:
    os.rmdir(path)


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class Mount:
    mount_root: str  # the path inside the hierarchy that is mounted (field 4)
    mount_point: str  # where it is mounted (field 5)
    fstype: str
    super_options: tuple[str, ...]


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mounts.append(
            Mount(
                mount_root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=rfields[0],
                super_options=tuple(rfields[2].split(",")),
            )
        )
    return mounts


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map controller name -> cgroup path; the unified (v2) entry is keyed ``""``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[""] = path
        else:
            for c in controllers.split(","):
                out[c] = path
    return out


def _resolve(root: Path, mount: Mount, cg_path: str) -> Path:
    rel = cg_path
    mr = mount.mount_root.rstrip("/")
    if mr and (rel == mr or rel.startswith(mr + "/")):
        rel = rel[len(mr) :]
    return root / mount.mount_point.lstrip("/") / rel.lstrip("/")


@dataclass(frozen=True)
class CgroupLayout:
    """The runner's own cgroup directories, where they exist."""

    v2: Path | None  # own cgroup in the unified hierarchy
    v1_memory: Path | None  # own cgroup in the v1 memory hierarchy
    v1_pids: Path | None = None  # own cgroup in the v1 pids hierarchy


def _v1_dir(root: Path, mounts: list[Mount], cg: dict[str, str], controller: str) -> Path | None:
    if controller not in cg:
        return None
    for m in mounts:
        if m.fstype == "cgroup" and controller in m.super_options:
            p = _resolve(root, m, cg[controller])
            if p.is_dir():
                return p
    return None


def discover(root: Path = Path("/")) -> CgroupLayout:
    try:
        cg = parse_proc_cgroup((root / "proc/self/cgroup").read_text())
        mounts = parse_mountinfo((root / "proc/self/mountinfo").read_text())
    except OSError:
        return CgroupLayout(None, None)
    v2 = None
    if "" in cg:
        for m in mounts:
            if m.fstype == "cgroup2":
                p = _resolve(root, m, cg[""])
                if p.is_dir():
                    v2 = p
                    break
    return CgroupLayout(
        v2=v2,
        v1_memory=_v1_dir(root, mounts, cg, "memory"),
        v1_pids=_v1_dir(root, mounts, cg, "pids"),
    )


def default_limit_bytes(root: Path = Path("/")) -> int:
    """80% of the memory available to the runner.

    That is the machine's available memory (``psutil.virtual_memory().available``),
    lowered to the head-room left under the runner's own cgroup limit when it
    has one (a runner in a container sees the host's /proc/meminfo).
    """
    avail = psutil.virtual_memory().available
    layout = discover(root)
    pairs = []
    if layout.v2 is not None:
        pairs.append((layout.v2 / "memory.max", layout.v2 / "memory.current"))
    if layout.v1_memory is not None:
        d = layout.v1_memory
        pairs.append((d / "memory.limit_in_bytes", d / "memory.usage_in_bytes"))
    for limit_f, usage_f in pairs:
        limit = _read_int(limit_f)
        usage = _read_int(usage_f)
        if limit is not None and usage is not None and limit < (1 << 60):
            avail = min(avail, max(limit - usage, 0))
    return int(avail * DEFAULT_CAP_FRACTION)


# --------------------------------------------------------------------------- helpers


def _read_int(path: Path) -> int | None:
    try:
        s = path.read_text().strip()
    except OSError:
        return None
    if s == "max":
        return None
    try:
        return int(s)
    except ValueError:
        return None


def _read_pids(procs: bytes) -> list[int]:
    """The pids a cgroup.procs file lists now (none when it cannot be read)."""
    try:
        fd = os.open(procs, os.O_RDONLY)
    except OSError:
        return []
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return []
    finally:
        os.close(fd)
    return [int(x) for x in b"".join(chunks).split() if x.isdigit()]


def _read_keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            with contextlib.suppress(ValueError):
                out[parts[0]] = int(parts[1])
    return out


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # O_TRUNC: as `echo >` does
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _safe_name(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "trial"
    return s[:60]


# --------------------------------------------------------------------------- setting up


def _enable_v2_controllers(parent: Path, wanted: list[str], notes: list[str]) -> list[str]:
    """Enable `wanted` for `parent`'s children; memory is required, the others optional."""
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    got = []
    for controller in wanted:
        if controller in enabled:
            got.append(controller)
            continue
        try:
            _write(parent / "cgroup.subtree_control", f"+{controller}")
        except OSError as e:
            if controller == "memory":
                raise CapError(
                    f"cannot enable memory in {parent}/cgroup.subtree_control: {e}"
                ) from e
            notes.append(f"{controller} controller not enabled in {parent}: {e}")
            continue
        got.append(controller)
    return got


def _limit_v2_memory(path: Path, limit: int, notes: list[str]) -> None:
    if not (path / "memory.max").exists():
        raise CapError(f"{path} has no memory.max")
    _write(path / "memory.max", str(limit))
    if (path / "memory.swap.max").exists():
        try:
            _write(path / "memory.swap.max", "0")
        except OSError as e:
            notes.append(f"memory.swap.max not set: {e}")
    if (path / "memory.oom.group").exists():
        with contextlib.suppress(OSError):
            _write(path / "memory.oom.group", "1")


def _limit_v1_memory(path: Path, limit: int, notes: list[str]) -> None:
    if not (path / "memory.limit_in_bytes").exists():
        raise CapError(f"{path} has no memory.limit_in_bytes")
    _write(path / "memory.limit_in_bytes", str(limit))
    memsw = path / "memory.memsw.limit_in_bytes"
    if memsw.exists():
        # Must come after limit_in_bytes (memsw >= limit is enforced).
        try:
            _write(memsw, str(limit))
        except OSError as e:
            notes.append(f"memory.memsw.limit_in_bytes not set: {e}")
    else:
        # No swap accounting: at least tell reclaim not to prefer swap.
        with contextlib.suppress(OSError):
            _write(path / "memory.swappiness", "0")
        notes.append("no swap accounting (memsw): swap is not capped")
    with contextlib.suppress(OSError):
        _write(path / "memory.oom_control", "0")  # make sure the OOM killer is on


def _new_cgroup(path: Path, configure: Callable[[Path], None]) -> Path:
    """mkdir `path` and configure it; on any failure the directory is removed again."""
    _mkdir(path)
    try:
        configure(path)
    except BaseException:
        with contextlib.suppress(OSError):
            _rmdir(path)
        raise
    return path


_OURS = re.compile(r"leakbisect-.*-(\d+)-\d+")


def remove_stale(parent: Path) -> list[Path]:
    """Remove trial cgroups under `parent` whose runner is gone (it was SIGKILLed before
    its clean-up): their processes are killed first. A cgroup is named
    ``leakbisect-<name>-<runner pid>-<n>``; one whose runner pid is alive is never touched.
    Returns the directories removed."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for d in entries:
        m = _OURS.fullmatch(d.name)
        if m is None or not d.is_dir() or psutil.pid_exists(int(m.group(1))):
            continue
        stale = MemoryCap("cgroup-v1", 1, d)  # only its process list and teardown are used
        stale.kill_all(timeout_s=2.0)
        with contextlib.suppress(OSError):
            _rmdir(d)
            removed.append(d)
    return removed


def _no_pids_note(where: str) -> str:
    return f"no pids limit from {where}: forks are limited by RLIMIT_NPROC and the sampler"


# --------------------------------------------------------------------------- the cap


class MemoryCap:
    """A hard memory (and process count) cap for one child process tree; a context manager.

    ``with MemoryCap.create(limit, "trial-7") as cap:
        Popen(..., preexec_fn=cap.preexec, start_new_session=True)``

    ``path`` is the trial's memory cgroup (v1) or its one cgroup (v2); ``pids_path`` the
    cgroup holding its ``pids.max`` (the same directory in v2, a directory in the v1 pids
    hierarchy), and ``pids_limit`` the limit the kernel enforces there (None: no cgroup
    limits the process count, see the module docstring).
    """

    def __init__(
        self,
        method: CapMethod,
        limit_bytes: int,
        path: Path | None = None,
        *,
        pids_path: Path | None = None,
        pids_limit: int | None = None,
    ):
        self.method: CapMethod = method
        # The cgroup's file names: v2's, else v1's (an enclosing cap may be either).
        self.v2 = method == "cgroup-v2"
        self.limit_bytes = int(limit_bytes)
        self.path = path  # the trial's memory cgroup directory (None for the watchdog)
        self.pids_path = pids_path
        self.pids_limit = pids_limit
        self.notes: list[str] = []
        self._tripped = False
        self._closed = False
        self._procs_files: list[bytes] = []
        self._foreign: frozenset[int] = frozenset()  # enclosing: not the trial's
        self._oom_base = 0
        self._refresh_dirs()

    def _refresh_dirs(self) -> None:
        # Read at every re-listing of a trial's tree: paths made once, read with os.read
        # (pathlib's read_text cost 0.3 ms a file between two readings, os.read 0.1 ms).
        self._listing = [os.fsencode(d / "cgroup.procs") for d in self.dirs]
        if self.method == "enclosing":  # the child is in it already; nothing to join
            return
        self._procs_files = list(self._listing)

    @property
    def dirs(self) -> list[Path]:
        """Every cgroup directory of this cap (memory first)."""
        return list(dict.fromkeys(d for d in (self.path, self.pids_path) if d is not None))

    # -- construction

    @classmethod
    def create(
        cls,
        limit_bytes: int,
        name: str,
        *,
        method: CapMethod | None = None,
        root: Path = Path("/"),
        pids_limit: int | None = DEFAULT_PIDS_LIMIT,
    ) -> MemoryCap:
        """The best cap available here: cgroup v2, else cgroup v1, else the watchdog.

        ``method`` forces one (tests use ``"watchdog"``); a forced cgroup method
        that cannot be set up raises `CapError`. ``pids_limit`` caps the number of
        processes (and threads) of the trial (None: no limit).
        """
        if limit_bytes <= 0:
            raise ValueError("limit_bytes must be positive")
        if method == "enclosing":
            return cls.enclosing(root)
        if method is not None and method not in METHODS:
            raise ValueError(f"unknown cap method {method!r}")
        if pids_limit is not None and pids_limit <= 0:
            raise ValueError("pids_limit must be positive")
        layout = discover(root)
        for parent in (layout.v2, layout.v1_memory, layout.v1_pids):
            if parent is not None:
                remove_stale(parent)
        cg_name = f"leakbisect-{_safe_name(name)}-{os.getpid()}-{next(_counter)}"
        notes: list[str] = []
        builders = (("cgroup-v2", cls._create_v2), ("cgroup-v1", cls._create_v1))
        for m, build in builders:
            if method not in (None, m):
                continue
            try:
                cap = build(layout, cg_name, limit_bytes, pids_limit)
            except (CapError, OSError) as e:
                notes.append(f"{m} unavailable: {e}")
                if method == m:
                    raise CapError(notes[-1]) from e
                continue
            cap.notes[:0] = notes
            return cap
        cap = cls("watchdog", limit_bytes)
        cap.notes = notes
        return cap

    @classmethod
    def _create_v2(
        cls, layout: CgroupLayout, cg_name: str, limit: int, pids_limit: int | None
    ) -> MemoryCap:
        parent = layout.v2
        if parent is None:
            raise CapError("no unified cgroup hierarchy")
        controllers = (parent / "cgroup.controllers").read_text().split()
        if "memory" not in controllers:
            raise CapError(f"memory controller not delegated to {parent}")
        notes: list[str] = []
        wanted = ["memory"]
        if pids_limit is not None:
            if "pids" in controllers:
                wanted.append("pids")
            else:
                notes.append(_no_pids_note(f"{parent} (pids controller not delegated)"))
        enabled = _enable_v2_controllers(parent, wanted, notes)

        def configure(path: Path) -> None:
            _limit_v2_memory(path, limit, notes)
            if "pids" in enabled:
                _write(path / "pids.max", str(pids_limit))

        path = _new_cgroup(parent / cg_name, configure)
        has_pids = "pids" in enabled
        cap = cls(
            "cgroup-v2",
            limit,
            path,
            pids_path=path if has_pids else None,
            pids_limit=pids_limit if has_pids else None,
        )
        cap.notes = notes
        return cap

    @classmethod
    def _create_v1(
        cls, layout: CgroupLayout, cg_name: str, limit: int, pids_limit: int | None
    ) -> MemoryCap:
        if layout.v1_memory is None:
            raise CapError("no v1 memory cgroup")
        notes: list[str] = []
        path = _new_cgroup(layout.v1_memory / cg_name, lambda p: _limit_v1_memory(p, limit, notes))
        cap = cls("cgroup-v1", limit, path)
        cap.notes = notes
        if pids_limit is None:
            return cap
        if layout.v1_pids is None:
            cap.notes.append(_no_pids_note("cgroup v1 (no pids hierarchy)"))
            return cap
        try:
            cap.pids_path = _new_cgroup(
                layout.v1_pids / cg_name, lambda p: _write(p / "pids.max", str(pids_limit))
            )
        except OSError as e:
            cap.notes.append(_no_pids_note(f"{layout.v1_pids}: {e}"))
            return cap
        cap.pids_limit = pids_limit
        cap._refresh_dirs()
        return cap

    @classmethod
    def enclosing(cls, root: Path = Path("/")) -> MemoryCap:
        """The cgroup this process is in as the trial's cap, capped by its owner (Slurm):
        see ``enclosing`` in the module docstring. `CapError` when no limit encloses it."""
        layout = discover(root)
        if layout.v2 is not None and (layout.v2 / "memory.events").is_file():
            path, v2, limit_file = layout.v2, True, "memory.max"
        elif layout.v1_memory is not None:
            path, v2, limit_file = layout.v1_memory, False, "memory.limit_in_bytes"
        else:
            raise CapError("no memory cgroup encloses this process")
        limits = [_read_int(d / limit_file) for d in (path, *path.parents)]
        found = [n for n in limits if n is not None and n < (1 << 60)]
        if not found:
            raise CapError(f"no memory limit on {path} or above it")
        cap = cls("enclosing", min(found), path)
        cap.v2 = v2
        cap._foreign = frozenset(cap.pids())
        cap._oom_base = cap.oom_kill_count() or 0
        return cap

    # -- joining

    def preexec(self) -> None:
        """Move the calling process into the cap; for ``Popen(preexec_fn=...)``.

        Runs between fork and exec, so it only uses raw syscalls on paths
        encoded in advance. A failure raises, and Popen raises in the parent:
        a trial never runs uncapped by accident.
        """
        pid = str(os.getpid()).encode()
        for procs in self._procs_files:
            fd = os.open(procs, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def add_pid(self, pid: int) -> None:
        """Move an existing process (and, in v2/v1 cgroup.procs, its threads) into the cap."""
        for d in self.dirs:
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        """Processes currently in any of the cap's cgroups (empty for the watchdog)."""
        found: dict[int, None] = {}
        for procs in self._listing:
            found.update(dict.fromkeys(_read_pids(procs)))
        return [p for p in found if p not in self._foreign]

    def memory_pids(self) -> set[int]:
        """Processes in the memory cgroup itself: a trial process outside it escaped."""
        if self.path is None:
            return set()
        return set(_read_pids(self._listing[0]))

    # -- reading

    def oom_killed(self, exit_code: int | None = None) -> bool:
        """Whether the cap killed something.

        v2: ``memory.events`` ``oom_kill`` > 0. v1: ``memory.oom_control``
        ``oom_kill`` > 0; on kernels without that counter, ``memory.failcnt`` > 0
        and the root exited by SIGKILL (``exit_code == -9``). Watchdog: `trip()`
        was called.
        """
        if self.method == "watchdog":
            return self._tripped
        if self.path is None:
            return False
        if self.method == "enclosing":
            return (self.oom_kill_count() or 0) > 0
        if self.v2:
            return _read_keyed(self.path / "memory.events").get("oom_kill", 0) > 0
        ctl = _read_keyed(self.path / "memory.oom_control")
        if "oom_kill" in ctl:
            return ctl["oom_kill"] > 0
        failcnt = _read_int(self.path / "memory.failcnt") or 0
        return failcnt > 0 and exit_code == -signal.SIGKILL

    def oom_kill_count(self) -> int | None:
        if self.method == "watchdog":
            return int(self._tripped)
        if self.path is None:
            return None
        events = "memory.events" if self.v2 else "memory.oom_control"
        count = _read_keyed(self.path / events).get("oom_kill")
        if count is None or self.method != "enclosing":
            return count
        return count - self._oom_base

    def forks_refused(self) -> int | None:
        """How many forks the pids limit refused (``pids.events`` ``max``); None: no limit."""
        if self.pids_path is None:
            return None
        return _read_keyed(self.pids_path / "pids.events").get("max", 0)

    def usage_bytes(self) -> int | None:
        """The cgroup's charged memory now (includes page cache); None for the watchdog."""
        if self.path is None:
            return None
        f = "memory.current" if self.v2 else "memory.usage_in_bytes"
        return _read_int(self.path / f)

    def peak_bytes(self) -> int | None:
        if self.path is None:
            return None
        f = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        return _read_int(self.path / f)

    # -- watchdog

    def trip(self) -> None:
        """Record that the watchdog killed the tree for exceeding the limit."""
        self._tripped = True

    # -- teardown

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the cap's cgroups and wait until they are empty."""
        if self.path is None:
            return True
        deadline = time.monotonic() + timeout_s
        kill_file = self.path / "cgroup.kill"
        while True:
            pids = self.pids()
            if not pids:
                return True
            if self.method == "cgroup-v2" and kill_file.exists():  # never an enclosing one
                with contextlib.suppress(OSError):
                    _write(kill_file, "1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        """Kill leftover tasks, move any unkillable ones to the parent, remove the cgroups."""
        if self._closed:
            return
        self._closed = True
        if self.path is None:
            return
        if self.method == "enclosing":  # not ours to move out of or remove
            self.kill_all()
            return
        if not self.kill_all():
            for d in self.dirs:
                for pid in self.pids():
                    with contextlib.suppress(OSError):
                        _write(d.parent / "cgroup.procs", str(pid))
        for d in self.dirs:
            self._remove(d)

    def _remove(self, path: Path) -> None:
        for attempt in range(50):
            try:
                _rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                # EBUSY while the last tasks finish exiting
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or attempt == 49:
                    self.notes.append(f"could not remove {path}: {e}")
                    return
                time.sleep(0.02)

    def __enter__(self) -> MemoryCap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MemoryCap({self.method!r}, limit={self.limit_bytes}, path={self.path})"
