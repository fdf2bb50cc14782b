"""bench/client_install.py still runs end to end (--quick: the client once, cold and warm).

No timing is asserted: only that the report is written, with the client's row whole.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_client_install_bench_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "bench-client-install.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.client_install", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    md = out.read_text()
    assert md.startswith("# Client install\n")
    assert "- Machine: " in md
    assert "- Command: `uv run python -m bench.client_install --quick --out " in md
    rows = re.findall(r"^\| (.+) \| (\d+\.\d) \| (\d+\.\d\d) \| (\d+) \| (\d+) \|$", md, re.M)
    assert [row[0] for row in rows] == ["client (`leakbisect`)"]
    size_mib, distributions = int(rows[0][3]), int(rows[0][4])
    assert size_mib > 0
    # leakbisect and its five default dependencies, with theirs.
    assert distributions >= 6


def test_the_bench_refuses_no_repeats() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.client_install", "--repeats", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == "client_install.py: error: --repeats: at least 1"
