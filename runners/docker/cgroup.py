"""The memory counters of one container's cgroup, read from the host side.

The Docker executor samples a trial from outside its container: the container's memory
cgroup is the host series (what the kernel charges the container, which is also what its
``mem_limit`` caps), and its process list gives the host PIDs the GPU series is matched
with (NVML reports host PIDs, not the container's).

Where the cgroup lives depends on the engine's cgroup driver and version; `find` tries,
under ``root`` (``/sys/fs/cgroup``, or the host's cgroup tree mounted elsewhere when the
runner itself runs in a container: ``--cgroup-root``):

* v1, cgroupfs driver: ``memory/docker/<id>``; systemd driver:
  ``memory/system.slice/docker-<id>.scope``;
* v2: ``docker/<id>``, ``system.slice/docker-<id>.scope``.

Counters (bytes; None where the kernel does not say):

* v1: ``memory.usage_in_bytes``, ``memory.stat`` (``total_rss`` anon, ``total_cache``
  file, ``total_shmem``, ``total_mapped_file``), ``memory.oom_control`` (``oom_kill``,
  kernels 4.13+), ``memory.max_usage_in_bytes``;
* v2: ``memory.current``, ``memory.stat`` (``anon``, ``file``, ``shmem``,
  ``file_mapped``), ``memory.events`` (``oom_kill``), ``memory.peak`` (5.19+).

The sample's ``rss`` is anon + mapped file pages: what the processes hold, like the
psutil series of the local executor, without the page cache a script's file reads leave
behind (reported as ``file``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Counters:
    usage: int
    anon: int | None
    file: int | None
    shmem: int | None
    mapped: int | None
    oom_kill: int | None
    peak: int | None

    @property
    def rss(self) -> int:
        if self.anon is None:
            return self.usage
        return self.anon + (self.mapped or 0)


@dataclass(frozen=True)
class ContainerCgroup:
    """The memory cgroup directory of one container and its layout ("v1" or "v2")."""

    path: Path
    version: str

    @property
    def source(self) -> str:
        return f"cgroup-{self.version}"

    def read(self) -> Counters | None:
        """The counters now, or None once the cgroup is gone (the container stopped)."""
        try:
            return _read_v1(self.path) if self.version == "v1" else _read_v2(self.path)
        except (FileNotFoundError, ProcessLookupError, OSError):
            return None

    def pids(self) -> list[int]:
        """Host PIDs of every process in the container (empty once it is gone)."""
        with contextlib.suppress(OSError):
            text = (self.path / "cgroup.procs").read_text()
            return [int(p) for p in text.split() if p.isdigit() and int(p) > 0]
        return []


def candidates(container_id: str, root: Path = DEFAULT_ROOT) -> list[ContainerCgroup]:
    """Where the container's memory cgroup may be, most likely first."""
    cid = container_id
    return [
        ContainerCgroup(root / "memory" / "docker" / cid, "v1"),
        ContainerCgroup(root / "memory" / "system.slice" / f"docker-{cid}.scope", "v1"),
        ContainerCgroup(root / "docker" / cid, "v2"),
        ContainerCgroup(root / "system.slice" / f"docker-{cid}.scope", "v2"),
    ]


def find(container_id: str, root: Path = DEFAULT_ROOT) -> ContainerCgroup | None:
    """The container's memory cgroup, or None when none of the layouts has it."""
    for cg in candidates(container_id, root):
        marker = "memory.usage_in_bytes" if cg.version == "v1" else "memory.current"
        if (cg.path / marker).exists():
            return cg
    return None


def parse_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.stat, memory.events, memory.oom_control)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value.strip())
    return out


def _int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _read_v1(path: Path) -> Counters:
    usage = int((path / "memory.usage_in_bytes").read_text())
    stat = parse_keyed((path / "memory.stat").read_text())
    oom = parse_keyed((path / "memory.oom_control").read_text())
    return Counters(
        usage=usage,
        anon=stat.get("total_rss", stat.get("rss")),
        file=stat.get("total_cache", stat.get("cache")),
        shmem=stat.get("total_shmem", stat.get("shmem")),
        mapped=stat.get("total_mapped_file", stat.get("mapped_file")),
        oom_kill=oom.get("oom_kill"),
        peak=_int(path / "memory.max_usage_in_bytes"),
    )


def _read_v2(path: Path) -> Counters:
    usage = int((path / "memory.current").read_text())
    stat = parse_keyed((path / "memory.stat").read_text())
    events = parse_keyed((path / "memory.events").read_text())
    return Counters(
        usage=usage,
        anon=stat.get("anon"),
        file=stat.get("file"),
        shmem=stat.get("shmem"),
        mapped=stat.get("file_mapped"),
        oom_kill=events.get("oom_kill"),
        peak=_int(path / "memory.peak"),
    )
