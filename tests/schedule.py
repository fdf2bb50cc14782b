"""Which test module an xdist worker runs next (a pytest plugin: pyproject's ``-p tests.schedule``).

pytest-xdist's ``--dist loadfile`` hands out whole modules (their module-scoped fixtures are
made once) in the order of their test counts, so a module of four long tests (the quick
benchmark's) started last and the suite waited minutes on one worker at the end. This
scheduler hands them out by the time they are expected to take. Its rules, in code order:

1. A module's expected time is its wall time in ``tests/durations.json``, which
   ``bench/suite.py`` writes from a measured run. A module missing from the file counts as
   the longest, so a new slow module is never the one left for the end.
2. A worker that asks for work (xdist asks when two of its tests are left) gets the longest
   waiting module whose group (`GROUPS`) is not running on another worker. The container
   modules take turns anyway (an inter-process lock, ``tests/conftest.py``), and two of the
   modules that load the machine on purpose make each other slow, so a worker would
   otherwise wait on the lock or on the other's load.
3. When every waiting module's group is running elsewhere, the worker takes the longest
   waiting module anyway: it never sits idle holding tests (a worker only runs a test once
   it knows the next one, so an idle worker would hold its last test back).
"""

import json
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

DURATIONS = Path(__file__).with_name("durations.json")

# The modules that start containers: some check that no container of a kind is left on the
# whole engine, so they take turns (tests/conftest.py `_containers_alone` holds a lock).
CONTAINER_MODULES = ("test_docker_executor", "test_docker_compose", "test_docker_gpu")
# Modules that should not run beside another module of their group.
GROUPS: dict[str, str] = {
    **{f"tests/{name}.py": "containers" for name in CONTAINER_MODULES},
    "tests/test_neighbours_e2e.py": "loads the machine",
    "tests/test_pace_e2e.py": "loads the machine",
    "tests/test_bench.py": "loads the machine",
    # Not loaders, but they judge fast unpaced loops whose readings a loader would thin.
    "tests/test_unpaced_e2e.py": "loads the machine",
    "tests/test_shapes.py": "loads the machine",
}


def expected_seconds() -> dict[str, float]:
    """Each module's measured wall seconds (rule 1); empty when the file is missing."""
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except FileNotFoundError:
        return {}


def pick(waiting: list[str], expected: dict[str, float], busy_groups: set[str]) -> str:
    """The module a worker gets next (rules 1-3) among the `waiting` ones."""
    unknown = max(expected.values(), default=0.0) + 1.0
    longest = sorted(waiting, key=lambda m: -expected.get(m, unknown))
    free = [m for m in longest if GROUPS.get(m) not in busy_groups]
    return (free or longest)[0]


class LongestFirst(LoadFileScheduling):
    """``--dist loadfile`` with rules 1-3 choosing the next module."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self.expected = expected_seconds()

    def _running_groups(self, besides: WorkerController) -> set[str]:
        return {
            GROUPS[scope]
            for node, units in self.assigned_work.items()
            if node is not besides
            for scope, tests in units.items()
            if scope in GROUPS and not all(tests.values())
        }

    def _assign_work_unit(self, node: WorkerController) -> None:
        chosen = pick(list(self.workqueue), self.expected, self._running_groups(besides=node))
        # xdist pops the front of its queue: put the chosen module there.
        self.workqueue.move_to_end(chosen, last=False)
        super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LongestFirst | None:
    if config.getoption("dist") != "loadfile":
        return None  # another --dist asked for on the command line: xdist's own
    return LongestFirst(config, log)
