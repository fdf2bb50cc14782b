"""A pytest plugin that records where the suite's time goes, module by module.

Load it with ``-p bench.suite_plugin`` and name a file in ``SUITE_PROFILE_OUT``; each worker
appends one JSON line per test module it ran: its wall time and the CPU the worker spent on it,
its own and its reaped children's (``getrusage``). With ``--dist loadfile`` a module runs whole
on one worker, so the lines add up to the suite. What runs outside the worker's process tree
(containers under dockerd, Slurm jobs under slurmd, the Postgres server) is not in a module's
CPU; the controller's line (``"module": "*"``) holds the whole machine's busy time from
``/proc/stat`` over the run, which does include it.
"""

import json
import os
import resource
import time
from pathlib import Path

import pytest

_current: dict[str, object] = {}


def _cpu() -> tuple[float, float]:
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


def _close() -> None:
    if not _current:
        return
    own, kids = _cpu()
    _write(
        {
            "module": _current["module"],
            "worker": _worker,
            "start": _current["start"],
            "wall_s": round(time.time() - float(_current["start"]), 2),  # type: ignore[arg-type]
            "own_cpu_s": round(own - float(_current["own"]), 2),  # type: ignore[arg-type]
            "child_cpu_s": round(kids - float(_current["kids"]), 2),  # type: ignore[arg-type]
            "tests": _current["tests"],
        }
    )
    _current.clear()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _is_controller:
        return  # xdist's controller hears every worker's tests, interleaved
    module = nodeid.split("::", 1)[0]
    if _current.get("module") == module:
        _current["tests"] = int(_current["tests"]) + 1  # type: ignore[call-overload]
        return
    _close()
    own, kids = _cpu()
    _current.update(module=module, start=time.time(), own=own, kids=kids, tests=1)


_is_controller = False
_worker = "main"


def pytest_configure(config: pytest.Config) -> None:
    # A worker is told so by xdist (`workerinput`), not by the environment, which a pytest
    # run inside a worker's test inherits.
    global _is_controller, _worker
    workerinput = getattr(config, "workerinput", None)
    _worker = workerinput["workerid"] if workerinput else "main"
    _is_controller = workerinput is None and bool(getattr(config.option, "numprocesses", None))


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _worker == "main":
        session.config.stash[_busy_key] = (time.time(), _machine_busy())


_busy_key = pytest.StashKey[tuple[float, float]]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _close()
    started = session.config.stash.get(_busy_key, None)
    if started is not None:
        t0, busy0 = started
        _write(
            {
                "module": "*",
                "worker": "controller",
                "start": t0,
                "wall_s": round(time.time() - t0, 2),
                "machine_busy_s": round(_machine_busy() - busy0, 2),
            }
        )
