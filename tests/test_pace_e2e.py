"""Verdicts that do not depend on the repro's pace or the machine's load (issue #35), end to
end: the real `bisect-cli run --no-attribute`, real uv environments, real child processes.

- An unpaced 50-step repro of the offline fixture (leakyfixture 1.0.0..1.0.9, first bad
  1.0.6) with a step marker after every step, as a new user writes one: 1 MiB of ETL work
  a step (a loop of about 0.3 s), with a CPU hog on every core (bench/hogs.py); idle, it is
  tests/test_unpaced_e2e.py's. Fifty markers are the evidence: every run gets a verdict,
  so the bisection is the one tests/test_run_e2e.py pins for the paced repro, run for run.
- The spike workload (`SPIKE_WORKLOAD`: a 200 MiB buffer touched page by page every 10th
  step, 3 MiB a step kept from 1.0.6 on) with no step markers, 50 steps at 0.1 s, under a
  CPU hog: touching the buffer takes longer on a loaded machine, and a spike must never be
  read as a floor.

Each pins the whole answer: first bad 1.0.6, last good 1.0.5, exit 0, every candidate's
verdict and the evaluations that decided, in order (one that decided nothing is run again).
bench/pace.py measures the same cells several times each (docs/bench-pace.md).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.hogs import load_was_real, machine_busy_s
from service.example.fixture import SPIKE_WORKLOAD, build_fixture
from service.example.index import serve_index
from service.example.paced import WORK_MIB_FOR, ReproSpec, write_repro
from tests.test_neighbours_e2e import EXPECTED, Bisection, assert_answer, neighbour
from tests.test_run_e2e import cli, run_args

pytestmark = pytest.mark.timeout(900)

# An unpaced 50-step loop of about 0.3 s (service/example/paced.py says how it was measured;
# bench/pace.py measures the 2 s one too).
UNPACED = ReproSpec(steps=50, pause_s=0.0, work_mib=WORK_MIB_FOR[0.3])
SPIKES = ReproSpec(steps=50, pause_s=0.1, markers=False)


def bisect(index: str, script: Path, home: Path, uv_cache: Path, condition: str) -> Bisection:
    """`bisect-cli run` of the fixture's 1.0.0..1.0.9 under `condition`. It must exit 0 and
    visit exactly what the paced repro visits; a failure lists every run and its reason."""
    db = home / "results.db"
    with neighbour(condition) as hog:
        started, busy = time.monotonic(), machine_busy_s()
        proc = cli(run_args("1.0.0..1.0.9", index, db, "--no-attribute", script=script), home,
                   uv_cache, timeout=800)  # fmt: skip
        if condition == "cpu hog":  # the load was real (bench/hogs.py says when)
            assert hog is not None
            why = load_was_real(hog, time.monotonic() - started, machine_busy_s() - busy)
            assert why is None, why
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    con = sqlite3.connect(db)
    rows = con.execute(
        "select c.version, t.evaluation, t.verdict, t.exit_code, t.analysis from trial t "
        "join candidate c on c.id = t.candidate_id where t.kind = 'run' order by t.id"
    ).fetchall()
    con.close()
    why = "\n".join([f"exit {proc.returncode}, {report['status']}: {report.get('message')}"] + [
        f"{v} #{e} {verdict}: {json.loads(a or '{}').get('reason')}"
        for v, e, verdict, _, a in rows
    ])  # fmt: skip
    # One entry per evaluation, in order: what its runs decided. A run that decided nothing
    # (on a loaded machine the reader can fall behind a fast loop's markers) is run again,
    # as the product does, and an evaluation that decided nothing is evaluated again; the
    # evaluations that decided are the paced repro's, one for one.
    said: dict[tuple[str, int], set[str]] = {}
    exits: dict[tuple[str, int], int] = {}
    for version, evaluation, verdict, code, _ in rows:
        said.setdefault((version, evaluation), set()).add(verdict)
        exits[(version, evaluation)] = exits.get((version, evaluation)) or code
    decided = {k: verdicts - {"inconclusive"} for k, verdicts in said.items()}
    decided = {k: verdicts for k, verdicts in decided.items() if verdicts}
    found = Bisection(report, [(v, verdicts.pop()) for (v, _), verdicts in decided.items()],
                      [exits[k] for k in decided], proc.stderr)  # fmt: skip
    expected = EXPECTED["leakyfixture"]
    assert (proc.returncode, found.visited) == (0, expected.visited), why
    return found


def steps_counted(found: Bisection) -> set[int | None]:
    return {r["analysis"]["step_count"] for e in found.report["evidence"] for r in e["runs"]}


def assert_unpaced_bisected_exactly(index: str, uv_cache: Path, home: Path, condition: str
                                    ) -> None:  # fmt: skip
    """The unpaced repro of about 0.3 s, bisected under `condition`: the paced answer."""
    script = write_repro(home / "repro.py", UNPACED)
    found = bisect(index, script, home, uv_cache, condition)
    assert_answer(found, EXPECTED["leakyfixture"])
    assert steps_counted(found) == {50}  # every run went its 50 steps, each marked


def test_an_unpaced_50_step_repro_is_bisected_exactly_under_a_cpu_hog(
    fixture_index: str, uv_cache: Path, reachable_dir
) -> None:
    assert_unpaced_bisected_exactly(fixture_index, uv_cache, reachable_dir("unpaced"), "cpu hog")


@pytest.fixture(scope="module")
def spike_index(reachable_dir) -> Iterator[str]:
    with serve_index(build_fixture(reachable_dir("spike-wheels"), SPIKE_WORKLOAD)) as url:
        yield url


def test_the_spike_workload_without_markers_is_bisected_exactly_under_a_cpu_hog(
    spike_index: str, uv_cache: Path, reachable_dir
) -> None:
    home = reachable_dir("spikes")
    script = write_repro(home / "repro.py", SPIKES)
    found = bisect(spike_index, script, home, uv_cache, "cpu hog")
    assert_answer(found, EXPECTED["leakyfixture"])
    assert steps_counted(found) == {None}  # no markers: no step count, judged by time alone
