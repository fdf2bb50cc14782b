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
