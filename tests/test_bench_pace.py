"""bench/pace.py (issue #35's pace-by-load benchmark) on one small cell, for real, so it cannot
rot: a real `bisect-cli run` of the offline fixture with an unpaced repro, its report rows,
and the score computed from the answer that run actually gave. No timing is asserted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.common import Config
from bench.pace import PACES, QUICK, SHAPES, Matrix, matrix_of, parser, run, score
from service.example.paced import ReproSpec

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ("1.0.5", "1.0.6")
LEAKING = {"1.0.6", "1.0.7", "1.0.8", "1.0.9"}  # leakyfixture 1.0.0..1.0.9: 1.0.6 on
LETTER = {"clean": "C", "leak": "L", "plateau": "P", "inconclusive": "?"}


def pace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.pace", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def expected_score(b: dict[str, Any]) -> str:
    """The score of an answer, worked out here from what the bisection returned."""
    judged = {v: x for v, x in b["verdicts"].items() if x in ("leak", "clean", "plateau")}
    wrong = [v for v, verdict in judged.items() if (verdict == "leak") != (v in LEAKING)]
    if b["status"] in (None, "error"):
        return "error"
    if wrong or b["status"] == "found" and (b["last_good"], b["first_bad"]) != TRUTH:
        return "wrong"
    return "right" if b["status"] == "found" else "inconclusive"


def rwi(found: list[dict[str, Any]]) -> str:
    n = [sum(b["score"] == s for b in found) for s in ("right", "wrong", "inconclusive")]
    text = "/".join(map(str, n))
    return text if n[0] == len(found) else f"**{text}**"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench-pace")
    proc = pace("--quick", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads((out / "bench" / "results.json").read_text())["pace"]


def test_the_quick_cell_is_one_real_bisection_scored_from_its_answer(quick) -> None:
    out, sec = quick
    [b] = sec["bisections"]
    assert (b["shape"], b["pace"], b["markers"], b["load"], b["repeat"]) == (
        "steady", "unpaced", True, "idle", 1)  # fmt: skip
    assert b["repro"] == "50 steps, unpaced, markers, 24 MiB of work a step"
    assert b["score"] == expected_score(b)
    assert b["exit_code"] == {"found": 0, "bounds_failed": 3, "inconclusive": 4}[b["status"]]
    # The runs are the bisection's run trials, in order, each with its verdict and reason.
    assert b["visited"] == [[r["version"], r["verdict"]] for r in b["runs"]]
    assert all(r["reason"] for r in b["runs"])
    judged = {v for v, verdict in b["verdicts"].items() if verdict is not None}
    assert judged == {r["version"] for r in b["runs"]}
    md = (out / "bench-pace.md").read_text()
    assert f"| steady | markers | {rwi([b])} |" in md
    false_leak = sum(r["verdict"] == "leak" and r["version"] not in LEAKING for r in b["runs"])
    missed = sum(r["verdict"] in ("clean", "plateau") and r["version"] in LEAKING
                 for r in b["runs"])  # fmt: skip
    unsure = [sum(r["verdict"] == "inconclusive" and (r["version"] in LEAKING) == leaking
                  for r in b["runs"]) for leaking in (True, False)]  # fmt: skip
    assert (f"| {rwi([b])} | {answer(b)} ×1 | {len(b['runs'])}.0 | ") in md
    assert (f"| {false_leak} / {missed} / {unsure[0]} / {unsure[1]} of {len(b['runs'])} |") in md
    assert f"- steady, unpaced, markers, idle #1: **{b['score']}**, {answer(b)}; " in md


def answer(b: dict[str, Any]) -> str:
    if b["status"] == "found":
        return f"{b['last_good']}..{b['first_bad']} (exit {b['exit_code']})"
    return f"{b['status']} (exit {b['exit_code']}): {b['message']}"


def test_the_quick_defaults_row_is_the_about_0_3_s_unpaced_repro_idle(quick) -> None:
    out, sec = quick
    [d] = sec["defaults"]
    assert (d["length"], d["load"], d["work_mib"]) == (0.3, "idle", 1)
    assert d["repro"] == "50 steps, unpaced, markers, 1 MiB of work a step"
    assert d["score"] == expected_score(d)
    assert len(d["loop_s"]) == 3 and all(x > 0 for x in d["loop_s"])
    visits = ", ".join(f"{r['version']} {LETTER[r['verdict']]}" for r in d["runs"])
    md = (out / "bench-pace.md").read_text()
    row = re.search(r"^\| about 0\.3 s \(1 MiB a step\) \| idle \| ([^|]+) \| ([^|]+) \| "
                    r"([^|]+) \| ([^|]+) \| ([^|]+) \| (\d+) \| ", md, re.M)  # fmt: skip
    assert row, md
    assert (row[3].strip(), row[5].strip(), int(row[6])) == (visits, answer(d), len(d["runs"]))


def test_the_section_is_in_benchmarks_md_with_its_machine_and_command(quick) -> None:
    out, sec = quick
    md = (out / "benchmarks.md").read_text()
    body = md[md.index("## 9. Pace and load") : md.index("## Reproduce")]
    assert "**Pace by load: right / wrong / inconclusive" in body
    assert f"| steady | markers | {rwi(sec['bisections'])} |" in body
    assert "**Unpaced 50-step repros of the fixture at the default options" in body
    assert body.count("Command: `uv run python -m bench.pace --quick --out ") == 2
    right = sum(b["score"] == "right" for b in sec["bisections"])
    assert f"- **Pace and load**: {right} of 1 bisections right, " in md


def test_render_rewrites_the_report_from_the_stored_results(quick, tmp_path: Path) -> None:
    out, _ = quick
    written = (out / "bench-pace.md").read_text()
    (out / "bench-pace.md").unlink()
    proc = pace("--render", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "bench-pace.md").read_text() == written
    proc = pace("--render", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"python -m bench.pace: error: --render: no measured pace section in "
        f"{tmp_path / 'bench' / 'results.json'}; run the benchmark first"
    )


def test_the_options_choose_the_cells() -> None:
    ap = parser()
    chosen = matrix_of(ap, ap.parse_args([
        "--repeats", "2", "--shapes", "native,steady", "--paces", "0.1s", "--markers",
        "without", "--loads", "cpu-hog", "--lengths", "none", "--no-warm-up",
    ]))  # fmt: skip
    assert chosen == Matrix(shapes=("native", "steady"), paces=("0.1s",), markers=(False,),
                            loads=("cpu hog",), repeats=2, lengths=(),
                            default_loads=("cpu hog",), warm_up=False)  # fmt: skip
    assert matrix_of(ap, ap.parse_args(["--lengths", "2", "--loads", "idle"])) == Matrix(
        lengths=(2.0,), loads=("idle",), default_loads=("idle",))  # fmt: skip
    assert matrix_of(ap, ap.parse_args([])) == Matrix()
    assert matrix_of(ap, ap.parse_args(["--quick", "--out", "x"])) == QUICK
    assert list(Matrix(paces=("unpaced", "1s")).cells()) == [
        ("unpaced", True), ("unpaced", False), ("1s", True), ("1s", False)]  # fmt: skip
    assert PACES["1s"].repro(False) == ReproSpec(steps=20, pause_s=1.0, markers=False)
    assert PACES["unpaced"].repro(True) == ReproSpec(steps=50, pause_s=0.0, work_mib=24)


def _answer(status: str | None, pair: tuple[str | None, str | None] = (None, None),
            verdicts: dict[str, str | None] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"status": status, "last_good": pair[0], "first_bad": pair[1],
            "verdicts": verdicts or {}}  # fmt: skip


@pytest.mark.parametrize(
    ("found", "scored"),
    [
        (_answer("found", TRUTH, {"1.0.0": "clean", "1.0.5": "clean", "1.0.6": "leak"}), "right"),
        (_answer("found", ("1.0.6", "1.0.7"), {"1.0.6": "clean", "1.0.7": "leak"}), "wrong"),
        (_answer("bounds_failed", verdicts={"1.0.0": "leak"}), "wrong"),  # a false leak
        (_answer("bounds_failed", verdicts={"1.0.0": "clean", "1.0.9": "plateau"}), "wrong"),
        (_answer("inconclusive", verdicts={"1.0.0": "clean", "1.0.5": "inconclusive"}),
         "inconclusive"),
        (_answer("bounds_failed", verdicts={"1.0.0": "inconclusive"}), "inconclusive"),
        (_answer("error"), "error"),
    ],
)  # fmt: skip
def test_score(found: dict[str, Any], scored: str) -> None:
    assert score(found, SHAPES["steady"].fixture) == scored == expected_score(found)


def test_the_suites_quick_run_measures_nothing_here_and_says_so(tmp_path: Path) -> None:
    sec = run(Config(quick=True, out=tmp_path, command="uv run python -m bench --quick"))
    assert (sec["bisections"], sec["defaults"]) == ([], [])
    assert sec["tables"][0]["rows"][0][1].startswith("not measured in quick mode")
    assert not (tmp_path / "bench-pace.md").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--shapes", "steady,nope"], "--shapes: unknown nope; known: steady, spike-workload, "
                                      "native"),
        (["--paces", "2s"], "--paces: unknown 2s; known: unpaced, 0.1s, 1s"),
        (["--loads", "busy"], "--loads: unknown busy; known: idle, cpu-hog"),
        (["--lengths", "5"], "--lengths: unknown 5; known: 0.3, 2"),
        (["--repeats", "0"], "--repeats: 0; allowed are 1 or more"),
        (["--quick"], "--quick needs --out DIR (a quick run must not overwrite docs/)"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_in_one_line(args: list[str], line: str) -> None:
    proc = pace(*args)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == f"python -m bench.pace: error: {line}"
