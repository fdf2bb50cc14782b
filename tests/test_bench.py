"""The benchmark harness still runs end to end (quick mode), so it cannot rot.

No timing is asserted: only that every section is written and every table has rows.
"""

import re
import subprocess
import sys
from pathlib import Path

from bench.report import HEADINGS

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_writes_every_section_with_tables(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

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
