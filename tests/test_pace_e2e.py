"""Verdicts that do not depend on the repro's pace or the machine's load (issue #35), end to
end: the real `bisect-cli run --no-attribute`, real uv environments, real child processes.

- An unpaced 50-step repro of the offline fixture (leakyfixture 1.0.0..1.0.9, first bad
  1.0.6) with a step marker after every step, as a new user writes one: with 1 MiB of ETL
  work a step (a loop of about 0.3 s) and with 24 MiB (about 2 s; service/example/paced.py
  says how these were measured), idle and with a CPU hog on every core (bench/hogs.py).
  Fifty markers are the evidence: every run gets a verdict, so the bisection is the one
  tests/test_run_e2e.py pins for the paced repro, run for run.
- The spike workload (`SPIKE_WORKLOAD`: a 200 MiB buffer touched page by page every 10th
  step, 3 MiB a step kept from 1.0.6 on) with no step markers, 50 steps at 0.1 s, under a
  CPU hog: touching the buffer takes longer on a loaded machine, and a spike must never be
  read as a floor.
- A repro of 12 unpaced steps, too short to judge alone: run again and pooled, and said.

Each pins the whole answer: first bad 1.0.6, last good 1.0.5, exit 0, every candidate's
verdict and the runs in order. bench/pace.py measures the same cells several times each
(docs/bench-pace.md).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.example.fixture import SPIKE_WORKLOAD, FixtureSpec, build_fixture
from service.example.index import serve_index
from service.example.paced import WORK_MIB_FOR, ReproSpec, write_repro
from tests.test_neighbours_e2e import EXPECTED, Bisection, assert_answer, neighbour
from tests.test_run_e2e import cli, run_args

pytestmark = pytest.mark.timeout(900)

UNPACED = {f"about {length:g} s": ReproSpec(steps=50, pause_s=0.0, work_mib=mib)
           for length, mib in WORK_MIB_FOR.items()}  # fmt: skip
SPIKES = ReproSpec(steps=50, pause_s=0.1, markers=False)


def bisect(index: str, script: Path, home: Path, uv_cache: Path, condition: str) -> Bisection:
    """`bisect-cli run` of the fixture's 1.0.0..1.0.9 under `condition`. It must exit 0 and
    visit exactly what the paced repro visits; a failure lists every run and its reason."""
    db = home / "results.db"
    with neighbour(condition) as hog:
        started = time.monotonic()
        proc = cli(run_args("1.0.0..1.0.9", index, db, "--no-attribute", script=script), home,
                   uv_cache, timeout=800)  # fmt: skip
        if condition == "cpu hog":  # the load was real: half a core's worth at least
            assert hog is not None
            used, spent = hog.cpu_s(), time.monotonic() - started
            assert used > 0.5 * spent, f"the CPU hog used {used:.1f} CPU s in {spent:.1f} s"
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    con = sqlite3.connect(db)
    rows = con.execute(
        "select c.version, t.verdict, t.exit_code, t.analysis from trial t "
        "join candidate c on c.id = t.candidate_id where t.kind = 'run' order by t.id"
    ).fetchall()
    con.close()
    found = Bisection(report, [(v, verdict) for v, verdict, *_ in rows],
                      [code for _, _, code, _ in rows], proc.stderr)  # fmt: skip
    why = "\n".join([f"exit {proc.returncode}, {report['status']}: {report.get('message')}"] + [
        f"{v} {verdict}: {json.loads(a or '{}').get('reason')}" for v, verdict, _, a in rows
    ])  # fmt: skip
    expected = EXPECTED["leakyfixture"]
    assert (proc.returncode, found.visited) == (0, expected.visited), why
    return found


def steps_counted(found: Bisection) -> set[int | None]:
    return {r["analysis"]["step_count"] for e in found.report["evidence"] for r in e["runs"]}


@pytest.mark.parametrize("condition", ["idle", "cpu hog"])
@pytest.mark.parametrize("length", list(UNPACED))
def test_an_unpaced_50_step_repro_is_bisected_exactly(
    fixture_index: str, uv_cache: Path, reachable_dir, length: str, condition: str
) -> None:
    home = reachable_dir("unpaced")
    script = write_repro(home / "repro.py", UNPACED[length])
    found = bisect(fixture_index, script, home, uv_cache, condition)
    assert_answer(found, EXPECTED["leakyfixture"])
    assert steps_counted(found) == {50}  # every run went its 50 steps, each marked


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


SHORT = """\
import leakyfixture

STEP_MARKER = "::leakbisect-step::"
for _ in range(12):  # a short repro: 12 unpaced steps, whatever LEAKBISECT_STEPS asks
    print(STEP_MARKER, flush=True)
    leakyfixture.step()
"""


@pytest.fixture(scope="module")
def four_mib_index(reachable_dir) -> Iterator[str]:
    """The fixture with a leak of 4 MiB a step: 9 judged steps then grow past the 8 MiB T."""
    spec = FixtureSpec(leak_kib_per_step=4096)
    with serve_index(build_fixture(reachable_dir("four-mib-wheels"), spec)) as url:
        yield url


def test_runs_too_short_to_judge_alone_are_run_again_and_pooled(
    four_mib_index: str, uv_cache: Path, reachable_dir
) -> None:
    """12 markers a run, fewer than the 21 that are always enough: every run is "too few
    readings to judge alone", so each candidate runs again (up to --max-runs 3) and its
    runs are judged together, and the report says so; the answer is exact."""
    home = reachable_dir("short")
    script = home / "repro.py"
    script.write_text(SHORT)
    db = home / "results.db"
    proc = cli(run_args("1.0.0..1.0.9", four_mib_index, db, "--no-attribute", script=script),
               home, uv_cache)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert (report["status"], report["last_good"], report["first_bad"]) == (
        "found", "1.0.5", "1.0.6"
    ), report["message"]
    con = sqlite3.connect(db)
    reasons = [json.loads(a)["reason"] for (a,) in con.execute(
        "select analysis from trial where kind = 'run' order by id")]  # fmt: skip
    con.close()
    assert reasons and all("too few readings to judge alone: " in r for r in reasons), reasons
    judged = {c["version"]: c for c in report["candidates"] if c["verdict"]}
    for version in ("1.0.5", "1.0.6"):
        runs = "3" if version == "1.0.6" else "[23]"
        assert re.match(
            rf"pooled over {runs} runs too short to judge alone: "
            rf"{judged[version]['verdict']}: ", judged[version]["pooled"]
        ), judged[version]
    # Every judged candidate's verdict is a pool's: clearing takes two runs, convicting three.
    for version, c in judged.items():
        needed = "3" if c["verdict"] == "leak" else "[23]"
        assert re.match(rf"pooled over {needed} runs too short", c["pooled"]), (version, c)
