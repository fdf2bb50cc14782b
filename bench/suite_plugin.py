"""A pytest plugin that records where the suite's time goes, module by module.

Load it with ``-p bench.suite_plugin`` and name a file in ``SUITE_PROFILE_OUT``; each worker
appends one JSON line per test module it ran: its wall time and the CPU the worker spent on it,
its own and its reaped children's (``getrusage``). With ``--dist loadfile`` a module runs whole
on one worker, so the lines add up to the suite. What runs outside the worker's process tree
(containers under dockerd, Slurm jobs under slurmd, the Postgres server) is not in a module's
CPU; the controller's line (``"module": "*"``) holds the whole machine's busy time from
``/proc/stat`` over the run, which does include it.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    """CPU seconds so far: this process's own, and its reaped children's."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _machine_busy() -> float:
    """Seconds of CPU the whole machine spent busy since boot (all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _write(record: dict[str, object]) -> None:
    out = os.environ.get("SUITE_PROFILE_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


@dataclass
class _Module:
    """The module this worker is running: when it started and the CPU counters then."""

    name: str
    start: float
    own: float
    kids: float
    tests: int = 1

    @classmethod
    def starting(cls, name: str) -> _Module:
        own, kids = _cpu()
        return cls(name, time.time(), own, kids)

    def record(self, worker: str) -> dict[str, object]:
        own, kids = _cpu()
        return {
            "module": self.name,
            "worker": worker,
            "start": self.start,
            "wall_s": round(time.time() - self.start, 2),
            "own_cpu_s": round(own - self.own, 2),
            "child_cpu_s": round(kids - self.kids, 2),
            "tests": self.tests,
        }


@dataclass
class _State:
    worker: str = "main"  # xdist's worker id, or "main" for the controller or a plain run
    controller: bool = False  # xdist's controller: it hears every worker's tests, interleaved
    module: _Module | None = None
    busy_at_start: tuple[float, float] | None = None  # (time, machine busy) on the controller

    def close_module(self) -> None:
        if self.module is not None:
            _write(self.module.record(self.worker))
            self.module = None


_state = _State()


def pytest_configure(config: pytest.Config) -> None:
    # A worker is told so by xdist (`workerinput`), not by the environment, which a pytest
    # run inside a worker's test inherits.
    workerinput = getattr(config, "workerinput", None)
    _state.worker = workerinput["workerid"] if workerinput else "main"
    _state.controller = workerinput is None and bool(getattr(config.option, "numprocesses", 0))


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _state.worker == "main":
        _state.busy_at_start = (time.time(), _machine_busy())


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _state.controller:
        return
    name = nodeid.split("::", 1)[0]
    if _state.module is not None and _state.module.name == name:
        _state.module.tests += 1
        return
    _state.close_module()
    _state.module = _Module.starting(name)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _state.close_module()
    if _state.busy_at_start is not None:
        t0, busy0 = _state.busy_at_start
        _write(
            {
                "module": "*",
                "worker": "controller",
                "start": t0,
                "wall_s": round(time.time() - t0, 2),
                "machine_busy_s": round(_machine_busy() - busy0, 2),
            }
        )
