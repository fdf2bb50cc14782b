"""Unpaced and short repros end to end, on an idle machine (their loaded twins are
tests/test_pace_e2e.py's, which takes turns with the other modules that load the machine):
the real `bisect-cli run --no-attribute`, real uv environments, real child processes.

- The unpaced 50-step repro of about 0.3 s: bisected exactly as the paced repro is.
- A repro of 12 unpaced steps, fewer than the 21 markers that are always enough: every run
  is too short to judge alone, so each candidate runs again and its runs are pooled, and
  the report says so; the answer is exact.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.example.fixture import FixtureSpec, build_fixture
from service.example.index import serve_index
from service.example.paced import write_repro
from tests.test_neighbours_e2e import EXPECTED, assert_answer
from tests.test_pace_e2e import UNPACED, bisect, steps_counted
from tests.test_run_e2e import cli, run_args

pytestmark = pytest.mark.timeout(900)


def test_an_unpaced_50_step_repro_is_bisected_exactly(
    fixture_index: str, uv_cache: Path, reachable_dir
) -> None:
    home = reachable_dir("unpaced")
    script = write_repro(home / "repro.py", UNPACED)
    found = bisect(fixture_index, script, home, uv_cache, "idle")
    assert_answer(found, EXPECTED["leakyfixture"])
    assert steps_counted(found) == {50}  # every run went its 50 steps, each marked


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
