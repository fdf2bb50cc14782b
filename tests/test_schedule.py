"""tests/schedule.py: which module a worker runs next (its rules 1-3)."""

from pathlib import Path

from tests.schedule import GROUPS, expected_seconds, pick

EXPECTED = {"tests/a.py": 10.0, "tests/b.py": 200.0, "tests/c.py": 50.0}
DOCKER = sorted(m for m, g in GROUPS.items() if g == "containers")


def test_the_longest_waiting_module_goes_first() -> None:
    assert pick(["tests/a.py", "tests/c.py", "tests/b.py"], EXPECTED, set()) == "tests/b.py"
    assert pick(["tests/a.py", "tests/c.py"], EXPECTED, set()) == "tests/c.py"


def test_a_module_without_a_measurement_counts_as_the_longest() -> None:
    assert pick(["tests/b.py", "tests/new.py"], EXPECTED, set()) == "tests/new.py"
    assert pick(["tests/a.py", "tests/new.py"], {}, set()) == "tests/a.py"  # none measured


def test_a_module_whose_group_runs_elsewhere_waits_for_a_free_one() -> None:
    expected = {DOCKER[0]: 300.0, "tests/a.py": 5.0}
    assert pick([DOCKER[0], "tests/a.py"], expected, {"containers"}) == "tests/a.py"
    assert pick([DOCKER[0], "tests/a.py"], expected, {"loads the machine"}) == DOCKER[0]


def test_when_every_waiting_module_is_held_back_the_longest_goes_anyway() -> None:
    expected = {DOCKER[0]: 300.0, DOCKER[1]: 100.0}
    assert pick([DOCKER[1], DOCKER[0]], expected, {"containers"}) == DOCKER[0]


def test_the_committed_durations_name_existing_modules_with_their_seconds() -> None:
    durations = expected_seconds()
    assert durations, "tests/durations.json is missing: uv run python -m bench.suite"
    root = Path(__file__).resolve().parents[1]
    assert [m for m in durations if not (root / m).is_file()] == []
    assert all(s >= 0 for s in durations.values())
    assert set(GROUPS) <= set(durations)
