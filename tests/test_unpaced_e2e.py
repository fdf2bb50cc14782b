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
import resource
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.hogs import machine_busy_s
from service.example.fixture import FixtureSpec, build_fixture
from service.example.index import serve_index
from tests.test_pace_e2e import assert_unpaced_bisected_exactly
from tests.test_run_e2e import cli, run_args

pytestmark = pytest.mark.timeout(900)


def test_an_unpaced_50_step_repro_is_bisected_exactly(
    fixture_index: str, uv_cache: Path, reachable_dir
) -> None:
    assert_unpaced_bisected_exactly(fixture_index, uv_cache, reachable_dir("unpaced"), "idle")


def _children_cpu_s() -> float:
    """CPU seconds of this process's reaped descendants (the CLI and its trials)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


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
    the answer is exact, unless other processes held half a core or more and even the
    pooled runs could not tell: then it says so, and no verdict is wrong."""
    home = reachable_dir("short")
    script = home / "repro.py"
    script.write_text(SHORT)
    db = home / "results.db"
    started, busy, own = time.monotonic(), machine_busy_s(), _children_cpu_s()
    proc = cli(run_args("1.0.0..1.0.9", four_mib_index, db, "--no-attribute", script=script),
               home, uv_cache)  # fmt: skip
    others = machine_busy_s() - busy - (_children_cpu_s() - own)
    report = json.loads(proc.stdout)
    if proc.returncode == 4 and others > 0.5 * (time.monotonic() - started):
        # Other processes held half a core or more (the suite's other workers): the reader
        # fell behind until even pooled runs could not tell. Then the answer says so, and no
        # verdict is ever wrong; on a machine that lets it keep up, it is exact (below).
        assert report["status"] == "inconclusive", report["message"]
        for c in report["candidates"]:
            truth = {"leak"} if c["version"] >= "1.0.6" else {"clean", "plateau"}
            assert c["verdict"] in truth | {None, "inconclusive"}, c
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
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
