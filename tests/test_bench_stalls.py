"""bench/stalls.py end to end on two real shapes (so it cannot rot), and its refusals."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stalls(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.stalls", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_report_counts_every_replay_and_no_bounded_shape_leaks(tmp_path: Path) -> None:
    out = tmp_path / "stalls.md"
    proc = stalls("--shapes", "leak_native,malloc_arenas", "--sizes", "0.1,0.3",
                  "--every", "0.1", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = out.read_text()
    assert proc.stdout == md
    rows = {m.group(1): m.groups() for m in re.finditer(
        r"^\| (\w+) \| (leak|bounded) \| (\w+) \| ([\d |]+) \|$", md, re.M)}  # fmt: skip
    assert set(rows) == {"leak_native", "malloc_arenas"}
    assert rows["leak_native"][1:3] == ("leak", "leak")
    assert rows["malloc_arenas"][1:3] == ("bounded", "plateau")
    for name, (_, _, _, cells) in rows.items():
        counts = [int(c) for c in cells.split(" | ")]
        assert len(counts) == 12, name  # 3 kinds x 4 verdicts
        per_kind = [sum(counts[i * 4 : (i + 1) * 4]) for i in range(3)]
        assert per_kind[0] == per_kind[1] == per_kind[2] > 0, (name, per_kind)
    assert int(rows["malloc_arenas"][3].split(" | ")[0]) == 0  # gap: no leak
    assert "Leak verdicts on bounded shapes: 0." in md
    assert "Command: `uv run python -m bench.stalls --shapes leak_native,malloc_arenas" in md


def test_unknown_shapes_and_bad_sizes_are_refused_in_one_line() -> None:
    proc = stalls("--shapes", "leak_native,nope")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith(
        "python -m bench.stalls: error: --shapes: unknown nope; known: import_ramp,"
    )
    proc = stalls("--sizes", "0.1,x")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "python -m bench.stalls: error: --sizes: not a list of seconds: '0.1,x'"
    )
    proc = stalls("--every", "0")
    assert proc.stderr.splitlines()[-1] == (
        "python -m bench.stalls: error: --sizes and --every must be positive seconds"
    )
