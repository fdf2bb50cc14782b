"""bench/suite.py runs pytest with its plugin and writes the report and the durations."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["tests/test_text.py", "tests/test_ddmin.py"]


def test_the_suite_bench_reports_each_module_and_merges_the_durations(tmp_path: Path) -> None:
    out, durations = tmp_path / "suite.md", tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/test_kept.py": 12.5}))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.suite", "--out", str(out), "--durations", str(durations),
         "--", *MODULES, "-n", "2", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == f"bench.suite: wrote {out} and {durations}"
    md = out.read_text()
    assert re.search(r"^- \*\*pytest\*\*: \d+ passed in [\d.]+s", md, re.M), md
    assert re.search(r"^- \*\*CPU\*\*: the machine was busy \d+ CPU-seconds", md, re.M), md
    assert "- **Modules**: 2;" in md
    # Each module has its row (wall, CPU, tests, worker); the two workers each ran one.
    walls = {}
    for module in MODULES:
        cells = rf"^\| {Path(module).name} \| ([\d.]+) \| [\d.]+ \(.*\) \| (\d+) \| gw\d \|"
        row = re.search(cells, md, re.M)
        assert row and int(row.group(2)) > 0, md
        walls[module] = float(row.group(1))
    assert re.findall(r"^\| (gw\d) \| 1 \|", md, re.M) == ["gw0", "gw1"], md
    written = json.loads(durations.read_text())
    assert set(written) == {"tests/test_kept.py", *MODULES}
    assert written["tests/test_kept.py"] == 12.5
    assert {m: written[m] for m in MODULES} == walls  # the report's wall seconds


def test_the_suite_bench_says_so_when_pytest_ran_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.suite", "--out", str(tmp_path / "s.md"),
         "--durations", str(tmp_path / "d.json"), "--", "tests/no_such_module.py", "-n", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 4  # pytest's own status for a path that does not exist
    assert (
        proc.stdout.splitlines()[-1] == "bench.suite: pytest ran no test (exit 4); nothing written"
    )
    assert not (tmp_path / "s.md").exists() and not (tmp_path / "d.json").exists()


def test_the_suite_bench_refuses_an_unknown_option_before_running_anything() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.suite", "--bogus"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == "bench.suite: error: unrecognized arguments: --bogus"
    assert proc.stdout == ""
