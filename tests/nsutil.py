"""Host pids of a trial's processes, for tests.

A trial runs in a PID namespace of its own (`runners.shim`): the pids its script sees
(``os.getpid()``, ``Popen.pid``) are not the host's. A script that reports a pid writes
``NS_PID_EXPR`` beside it (its namespace, e.g. ``pid:[4026532301]``); `host_pid` turns
the pair into the host's pid while the process lives, None once it is gone (its
namespace dies with it). Without a namespace (not root) the pids are the host's and
`host_pid` finds them all the same.
"""

from __future__ import annotations

import os

# Python source, evaluated inside the script (it needs `import os`).
NS_PID_EXPR = 'os.readlink("/proc/self/ns/pid")'


def nspid(pid: int | str) -> list[int]:
    """The host process `pid`'s pid in each PID namespace it is in, the host's first (its
    own namespace's last: 1 for a namespace's init)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def host_pid(ns: str, pid: int) -> int | None:
    """The host pid of the live, non-zombie process `pid` of PID namespace `ns`."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != ns:
                continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            if nspid(name)[-1:] == [pid]:
                return int(name)
        except (OSError, IndexError):
            continue
    return None


def members(ns: str) -> dict[int, float]:
    """Every live, non-zombie process of PID namespace `ns`: host pid -> start time (ticks
    since boot). The kernel reuses a dead namespace's inode for a new one, so a process
    found under the same `ns` later may be another trial's; the start time tells them apart."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != ns:
                continue
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                found[int(name)] = float(fields[19])  # starttime: field 22 of stat
        except (OSError, IndexError):
            continue
    return found


def still_running(before: dict[int, float]) -> list[int]:
    """The processes of `before` (from `members`) that still run: same pid, same start."""
    now: list[int] = []
    for pid, started in before.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and float(fields[19]) == started:
            now.append(pid)
    return now
