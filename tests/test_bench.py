"""The benchmark harness still runs end to end (quick mode), so it cannot rot.

No timing is asserted: only that every section is written and every table has rows.
"""

import re
import subprocess
import sys
from pathlib import Path

from bench.report import HEADINGS
from bench.stages import ddmin_counts

ROOT = Path(__file__).resolve().parents[1]


def bench(*args: str) -> None:
    """Run a benchmark command from the repository root; it must succeed."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=580
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_quick_benchmark_writes_every_section_with_tables(tmp_path: Path) -> None:
    bench("-m", "bench", "--quick", "--out", str(tmp_path))

    md = (tmp_path / "benchmarks.md").read_text()
    assert "Not measured in this run" not in md
    for heading in HEADINGS.values():
        assert heading in md, heading
    # Each section, from its heading to the next one, holds at least one table with rows,
    # and every table is followed by the machine and the command that produced it.
    starts = [md.index(h) for h in HEADINGS.values()] + [md.index("## Reproduce")]
    for heading, a, b in zip(HEADINGS.values(), starts, starts[1:], strict=False):
        body = md[a:b]
        tables = re.findall(r"^\| --- .*\n((?:\|.*\n)+)", body, re.M)
        assert tables, f"no table in {heading}"
        assert all(t.strip() for t in tables), f"an empty table in {heading}"
        assert body.count("Machine: ") >= len(tables), heading
        assert body.count("Command: `uv run python -m bench --quick") >= len(tables), heading
    for png in ("classifier_rates.png", "classifier_sweep.png", "bisection.png", "envs.png"):
        assert (tmp_path / "bench" / png).stat().st_size > 0, png


def test_stages_bench_writes_its_report(tmp_path: Path) -> None:
    """One scenario of section 3, no warm-up (the whole bench runs them all, twice each)."""
    report = tmp_path / "bench-stages.md"
    bench("bench/stages.py", "--repeats", "1", "--scenarios", "one", "--no-warm-up",
          "--report", str(report))  # fmt: skip
    md = report.read_text()
    # ddmin is pure: its counts are exact (every position, every pair up to 16 changes).
    assert "| 6 | 56 | 5.83 / 7 | 12.87 / 21 | 15 |" in md
    assert "| 16 | 306 | 8.00 / 10 | 20.97 / 28 | 120 |" in md
    for run in ("untraced", "tracemalloc", "memray"):
        assert re.search(rf"^\| {run} \| \d+\.\d\d \| ", md, re.M), run
    # The scenario's trials are those tests/test_stages_e2e.py pins for it (the release
    # search's fifth is the witness above the first bad release: engine/planner.py rule 5).
    row = re.search(r"^\| which dependency: one \| (\d+\.\d) \| (.*) \|$", md, re.M)
    assert row, md
    assert row.group(2) == "7 mixes + 5 releases | 0 | 0 | suite-gamma; first bad suite-gamma 1.0.3"


def test_stages_bench_refuses_an_unknown_scenario() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/stages.py", "--scenarios", "one,two"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "stages.py: error: --scenarios: unknown two; choose from one, interaction, "
        "unresolvable, python, native, commits, all or none"
    )


def test_readme_ddmin_table_is_the_benchmarks() -> None:
    """The README's rows of mixes per culprit are what bench/stages.py counts."""
    rows = ddmin_counts()

    def cells(key: str) -> list[str]:
        out = []
        for r in rows:
            v = r[key]
            out.append(f"{sum(v) / len(v):.1f} / {max(v)}" if v else "")
        return out

    text = (ROOT / "README.md").read_text()
    single = re.search(r"^\| one culprit: mean / max over its n positions \|(.*)\|$", text, re.M)
    pair = re.search(r"^\| two interacting: mean / max over every pair \|(.*)\|$", text, re.M)
    assert single and pair
    assert [c.strip() for c in single.group(1).split("|")] == cells("single")
    assert [c.strip() for c in pair.group(1).split("|")] == cells("pair")
