"""Unpaced and short repros end to end, on an idle machine (their loaded twins are
tests/test_pace_e2e.py's, which takes turns with the other modules that load the machine):
the real `bisect-cli run --no-attribute`, real uv environments, real child processes.

- The unpaced 50-step repro of about 0.3 s: bisected exactly as the paced repro is.
- A repro of 16 unpaced steps, fewer than the 21 markers that are always enough: every run
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
from tests.test_pace_e2e import assert_unpaced_bisected_exactly
from tests.test_run_e2e import cli, run_args

pytestmark = pytest.mark.timeout(900)


def test_an_unpaced_50_step_repro_is_bisected_exactly(
    fixture_index: str, uv_cache: Path, reachable_dir
) -> None:
    assert_unpaced_bisected_exactly(fixture_index, uv_cache, reachable_dir("unpaced"), "idle")


TOO_FEW = "too few readings to judge alone: "  # a run's reason
TOO_SHORT = "runs too short to judge alone"  # a pool's
SHORT = """\
import leakyfixture

STEP_MARKER = "::leakbisect-step::"
for _ in range(16):  # a short repro: 16 unpaced steps, whatever LEAKBISECT_STEPS asks
    print(STEP_MARKER, flush=True)
    leakyfixture.step()
"""


@pytest.fixture(scope="module")
def four_mib_index(reachable_dir) -> Iterator[str]:
    """The fixture with a leak of 4 MiB a step: a short run's judged steps grow past T (8 MiB)."""
    spec = FixtureSpec(leak_kib_per_step=4096)
    with serve_index(build_fixture(reachable_dir("four-mib-wheels"), spec)) as url:
        yield url


def test_runs_too_short_to_judge_alone_are_run_again_and_pooled(
    four_mib_index: str, uv_cache: Path, reachable_dir
) -> None:
    """16 markers a run, fewer than the 21 that are always enough: a run is "too few
    readings to judge alone" unless the machine's load stretched it long enough for the
    clock's readings to fill its blocks. A candidate whose runs were all too short runs
    again (up to --max-runs 3) and its runs are judged together, and the report says so;
    the answer is exact."""
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
    rows = con.execute(
        "select c.version, t.analysis from trial t join candidate c on c.id = t.candidate_id "
        "where t.kind = 'run' order by t.id"
    ).fetchall()
    con.close()
    short: dict[str, list[bool]] = {}
    for version, analysis in rows:
        short.setdefault(version, []).append(TOO_FEW in json.loads(analysis)["reason"])
    judged = {c["version"]: c for c in report["candidates"] if c["verdict"]}
    pooled = [v for v, runs in short.items() if v in judged and all(runs)]
    # On an idle machine every run is too short; a loaded one may stretch a few.
    assert {"1.0.5", "1.0.6"} & set(pooled), rows
    for version in pooled:  # clearing takes two runs, convicting three
        c = judged[version]
        needed = "3" if c["verdict"] == "leak" else "[23]"
        assert re.match(rf"pooled over {needed} {TOO_SHORT}: {c['verdict']}: ", c["pooled"]), (
            version, c, rows
        )  # fmt: skip
    for version, runs in short.items():  # a pool needs two runs too short
        assert (judged[version]["pooled"] is None) == (sum(runs) < 2), (version, rows)
