"""9. Pace and load: bisections at three paces, with and without markers, idle and loaded.

``uv run python -m bench.pace [--repeats N] [--shapes a,b] [--paces a,b] [--markers
with,without] [--loads idle,cpu-hog] [--lengths 0.3,2] [--no-warm-up] [--quick --out DIR]``

A user's first repro is an unpaced loop; the leak per step does not depend on the pace, so
neither may the answer. Each bisection is a real ``bisect-cli run --no-attribute`` of
leakyfixture 1.0.0..1.0.9 (first bad 1.0.6; 1.0.3 yanked, 1.0.4 a Windows-only wheel)
served on 127.0.0.1, in a fresh database, with the environments of a first, uncounted
bisection of the same fixture reused (so wall time is the search), for every cell of:

- **shape** (`SHAPES`): the fixture's leak from 1.0.6 on, and its bounded noise on every
  release (the clean releases 1.0.0-1.0.5 are the bounded shapes a false leak would come
  from): *steady*, the default fixture (1 MiB a step kept, 32 MiB spikes held two steps,
  a cache that fills, churn); *spike workload*, `SPIKE_WORKLOAD` (3 MiB a step kept, a
  200 MiB buffer touched page by page every 10th step); *native*, the default fixture
  leaking through malloc in C;
- **pace** (`PACES`): *unpaced* (no pause, 24 MiB of ETL work a step: about 40 ms a step,
  a 50-step loop of about 2 s idle), *0.1 s* (a 0.1 s pause a step, 50 steps) and *1 s*
  (a 1 s pause a step, 20 steps, so a run is about 20 s, and 40 s where the service asks
  for twice the steps);
- **markers**: the repro prints a step marker after each step, or none
  (`service.example.paced` bakes the knobs into a copy of the bundled repro);
- **load** (`LOADS`): idle, or a CPU hog on every core (bench/hogs.py `cpu_hog`) for the
  whole cell;
- **repeats**: `--repeats` bisections each (default 3).

Each is scored (`score`): **right** when it found exactly 1.0.5..1.0.6 and no candidate's
verdict contradicts the fixture; **wrong** for any other pair, or a clean release called a
leak (a false leak) or a leaking one clean or a plateau, also when the job ended on it (a
bound that failed its check); **inconclusive** for a job that ended inconclusive or on a
bound that could not be judged; **error** when bisect-cli gave no answer. Every run trial's
verdict is counted too, against the fixture's truth.

A second table (`DEFAULTS`) is issue #35's question: what unpaced 50-step repros of the
default fixture (with markers) return at the default options, with 1 MiB of work a step (a
loop of about 0.3 s) and 24 MiB (about 2 s), idle and under a CPU hog: each run's verdict
and the bisection's answer. The loop's length is measured under the same load, outside
the service: the repro run by this interpreter with the release's wheel on its path, from
the first marker to the last (`loop_seconds`).

The report is docs/bench-pace.md (every bisection's runs in order); the tables are also
section 9 of docs/benchmarks.md (merged into OUT/bench/results.json). ``python -m bench``
measures the whole matrix (several hours on a 2-core machine: the 1 s pace dominates);
its quick run measures nothing here and says so, and ``--quick`` here runs one small cell
(steady, unpaced, markers, idle, one bisection, no warm-up) and the 0.3 s idle row of the
second table, which tests/test_bench_pace.py checks.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    Config,
    clean_env,
    machine,
    reachable_tmpdir,
    run_section,
    secs,
    table,
    write_report,
)
from bench.neighbours import LETTER, bisection, neighbour, watched
from bench.report import INTROS, footer, md_table, merge
from engine.analysis import ClassifierSettings
from runners.markers import STEP_MARKER
from service.example.fixture import SPIKE_WORKLOAD, FixtureSpec, build_fixture
from service.example.index import serve_index
from service.example.paced import WORK_MIB_FOR, ReproSpec, write_repro

PACKAGE, SPAN = "leakyfixture", "1.0.0..1.0.9"
TRUTH = ("1.0.5", "1.0.6")  # (last good, first bad) of every shape
LOADS = ("idle", "cpu hog")
THRESHOLD_MIB = ClassifierSettings().min_growth_mib  # the default absolute threshold
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs"


@dataclass(frozen=True)
class Shape:
    what: str
    fixture: FixtureSpec
    leak_mib_per_step: float


SHAPES = {
    "steady": Shape("1 MiB a step kept; 32 MiB spikes, a filling cache, churn", FixtureSpec(), 1),
    "spike-workload": Shape(
        "3 MiB a step kept; a 200 MiB buffer touched page by page every 10th step",
        SPIKE_WORKLOAD, SPIKE_WORKLOAD.leak_kib_per_step / 1024,
    ),
    "native": Shape("1 MiB a step malloc'd in C; default noise", FixtureSpec(leak_via="native"), 1),
}  # fmt: skip


@dataclass(frozen=True)
class Pace:
    what: str
    steps: int
    pause_s: float
    work_mib: int = 0

    def repro(self, markers: bool) -> ReproSpec:
        return ReproSpec(steps=self.steps, pause_s=self.pause_s, markers=markers,
                         work_mib=self.work_mib)  # fmt: skip


PACES = {
    "unpaced": Pace("no pause, 24 MiB of work a step (about 40 ms)", 50, 0.0, WORK_MIB_FOR[2.0]),
    "0.1s": Pace("0.1 s pause a step", 50, 0.1),
    "1s": Pace("1 s pause a step, 20 steps (about 20 s a run)", 20, 1.0),
}
# Issue #35's unpaced 50-step repros at the defaults: loop length (s) -> the repro.
DEFAULTS = {length: ReproSpec(steps=50, pause_s=0.0, work_mib=mib)
            for length, mib in WORK_MIB_FOR.items()}  # fmt: skip
# The warm-up bisection builds the environments: the bundled repro, whose runs of about 2 s
# get a verdict each, so it visits the candidates a right answer visits.
WARM_UP = ReproSpec()


@dataclass(frozen=True)
class Matrix:
    """Which cells to measure, and how many bisections each."""

    shapes: tuple[str, ...] = tuple(SHAPES)
    paces: tuple[str, ...] = tuple(PACES)
    markers: tuple[bool, ...] = (True, False)
    loads: tuple[str, ...] = LOADS
    repeats: int = 3
    # The defaults table: its loop lengths (s) and loads; () measures none of it.
    lengths: tuple[float, ...] = tuple(DEFAULTS)
    default_loads: tuple[str, ...] = LOADS
    warm_up: bool = True

    def cells(self) -> Iterator[tuple[str, bool]]:
        for pace in self.paces:
            for markers in self.markers:
                yield pace, markers


QUICK = Matrix(shapes=("steady",), paces=("unpaced",), markers=(True,), loads=("idle",),
               repeats=1, lengths=(0.3,), default_loads=("idle",), warm_up=False)  # fmt: skip


@dataclass
class Target:
    """One shape's fixture, served, and the directory its bisections share environments in."""

    shape: str
    url: str
    home: Path
    wheels: Path
    runs: int = field(default=0)

    def bisect(self, repro: ReproSpec, label: str) -> dict[str, Any]:
        """One bisection with `repro`, in a fresh database; its answer, or its error."""
        self.runs += 1
        run_dir = self.home / f"run-{self.runs:03d}"
        run_dir.mkdir(parents=True)
        script = write_repro(run_dir / "repro.py", repro)
        with watched() as seen:
            try:
                found = bisection(PACKAGE, ["--index-url", self.url], script, SPAN, self.home,
                                  run_dir)  # fmt: skip
            except (RuntimeError, subprocess.SubprocessError) as exc:
                found = {"error": str(exc)[-600:], "status": None, "verdicts": {}, "runs": [],
                         "visited": [], "wall_s": None}  # fmt: skip
        found.update(shape=self.shape, label=label, repro=repro.describe(),
                     max_load=seen["max_load"])  # fmt: skip
        found["score"] = score(found, SHAPES[self.shape].fixture)
        return found


def score(found: dict[str, Any], fixture: FixtureSpec) -> str:
    """right, wrong, inconclusive or error (the module docstring says which is which)."""
    if found.get("error") or found["status"] in (None, "error"):
        return "error"
    if any(_contradicts(verdict, v, fixture) for v, verdict in found["verdicts"].items()):
        return "wrong"
    if found["status"] != "found":
        return "inconclusive"
    return "right" if (found["last_good"], found["first_bad"]) == TRUTH else "wrong"


def _contradicts(verdict: str | None, version: str, fixture: FixtureSpec) -> bool:
    if fixture.leaks(version):
        return verdict in ("clean", "plateau")
    return verdict == "leak"


def run_counts(found: dict[str, Any], fixture: FixtureSpec) -> dict[str, int]:
    """Its run trials against the truth: false leaks, missed leaks, inconclusive runs."""
    runs = found["runs"]
    leaking = [r for r in runs if fixture.leaks(r["version"])]
    clean = [r for r in runs if not fixture.leaks(r["version"])]
    return {
        "runs": len(runs),
        "leaking_runs": len(leaking),
        "false_leak": sum(r["verdict"] == "leak" for r in clean),
        "missed": sum(r["verdict"] in ("clean", "plateau") for r in leaking),
        "inconclusive_leaking": sum(r["verdict"] == "inconclusive" for r in leaking),
        "inconclusive_clean": sum(r["verdict"] == "inconclusive" for r in clean),
    }


def loop_seconds(wheel: Path, repro: ReproSpec, work: Path) -> float | None:
    """First step marker to last of one run of `repro`, outside the service: this interpreter
    with the pure-Python `wheel` on its path (Python imports from the zip)."""
    script = write_repro(work / "loop.py", repro)
    marks = []
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                          env=clean_env(PYTHONPATH=str(wheel))) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == STEP_MARKER:
                marks.append(time.perf_counter())
    return marks[-1] - marks[0] if len(marks) > 1 else None


# ------------------------------------------------------------------------------- measure


@contextmanager
def served(work: Path, shape: str) -> Iterator[Target]:
    """`shape`'s fixture built under `work` and served on 127.0.0.1 while the block runs."""
    home = work / shape
    with serve_index(build_fixture(home / "wheels", SHAPES[shape].fixture)) as url:
        yield Target(shape, url, home, home / "wheels")


def measure(cfg: Config, matrix: Matrix) -> dict[str, Any]:
    """Every bisection of `matrix`: its cells', then the defaults table's."""
    out: dict[str, Any] = {"bisections": [], "defaults": []}
    names = [*matrix.shapes]
    if matrix.lengths and "steady" not in names:
        names.append("steady")  # the defaults table is the steady shape's
    with reachable_tmpdir(prefix="bench-pace-") as tmp:
        for name in names:
            with served(Path(tmp), name) as target:
                if matrix.warm_up:
                    warm = target.bisect(WARM_UP, "warm-up")
                    cfg.log(f"pace: {name}: first bisection, environments built (not counted): "
                            f"{_answer(warm)}, {len(warm['runs'])} runs")  # fmt: skip
                if name in matrix.shapes:
                    out["bisections"] += _cells(cfg, matrix, target)
                if name == "steady":
                    out["defaults"] += _defaults(cfg, matrix, target)
    return out


def _cells(cfg: Config, matrix: Matrix, target: Target) -> list[dict[str, Any]]:
    found = []
    for pace, markers in matrix.cells():
        repro = PACES[pace].repro(markers)
        for load in matrix.loads:
            label = f"{target.shape}, {pace}, {_marks(markers)}, {load}"
            cell = []
            with neighbour(load, 0) as hog:
                t0 = time.monotonic()
                for repeat in range(1, matrix.repeats + 1):
                    b = target.bisect(repro, label)
                    b.update(pace=pace, markers=markers, load=load, repeat=repeat)
                    cfg.log(f"pace: {label} #{repeat}: {b['score']} ({_answer(b)}, "
                            f"{len(b['runs'])} runs, {secs(b['wall_s'])} s)")  # fmt: skip
                    cell.append(b)
                share = hog.cpu_s() / (time.monotonic() - t0) if hog else None
            for b in cell:
                b["hog_cores"] = share  # CPU seconds the hog used per second: cores it kept busy
            found += cell
    return found


def _defaults(cfg: Config, matrix: Matrix, target: Target) -> list[dict[str, Any]]:
    rows = []
    wheel = target.wheels / SHAPES["steady"].fixture.wheel_filename(TRUTH[0])
    for length in matrix.lengths:
        repro = DEFAULTS[length]
        for load in matrix.default_loads:
            with neighbour(load, 0):
                loops = [loop_seconds(wheel, repro, target.home) for _ in range(3)]
                b = target.bisect(repro, f"defaults, about {length:g} s, {load}")
            b.update(length=length, load=load, work_mib=repro.work_mib,
                     loop_s=[x for x in loops if x is not None])  # fmt: skip
            cfg.log(f"pace: {b['label']}: loop {_loop(b)} s; {b['score']} ({_answer(b)})")
            rows.append(b)
    return rows


def run(cfg: Config, matrix: Matrix | None = None) -> dict[str, Any]:
    """The section: `matrix` (default: all of it), or nothing in the suite's quick run. A
    measured one is stamped (`run_section`) and written to OUT/bench-pace.md too."""
    out: dict[str, Any] = {"title": "9. Pace and load", "quick": cfg.quick}
    if matrix is None and cfg.quick:
        out.update(bisections=[], defaults=[], tables=[_not_measured()])
        return out
    matrix = matrix or Matrix()
    out["matrix"] = {"shapes": list(matrix.shapes), "paces": list(matrix.paces),
                     "markers": list(matrix.markers), "loads": list(matrix.loads),
                     "repeats": matrix.repeats, "lengths": list(matrix.lengths),
                     "default_loads": list(matrix.default_loads),
                     "warm_up": matrix.warm_up}  # fmt: skip
    sec = run_section(lambda c: {**out, **measure(c, matrix)}, cfg, machine())
    sec["tables"] = tables(sec)
    write_report(cfg.out / "bench-pace.md", render(sec))
    return sec


def tables(res: dict[str, Any]) -> list[dict[str, Any]]:
    """benchmarks.md's tables: pace by load, and the defaults table (those measured)."""
    return [t for t in (_pace_table(res), _defaults_table(res)) if t["rows"]]


# -------------------------------------------------------------------------------- tables


def _marks(markers: bool) -> str:
    return "markers" if markers else "no markers"


def _answer(b: dict[str, Any]) -> str:
    """What the bisection answered, short: the pair it found, or its status and why."""
    if b.get("error"):
        return f"error: {b['error'].splitlines()[-1][:120]}"
    if b["status"] == "found":
        return f"{b['last_good']}..{b['first_bad']} (exit {b['exit_code']})"
    return f"{b['status']} (exit {b['exit_code']}): {b.get('message') or ''}"


def _loop(b: dict[str, Any]) -> str:
    return secs(statistics.median(b["loop_s"])) if b["loop_s"] else "n/a"


def _counts(cell: list[dict[str, Any]]) -> Counter[str]:
    return Counter(b["score"] for b in cell)


def _rwi(cell: list[dict[str, Any]]) -> str:
    """right/wrong/inconclusive, bold unless every bisection was right; errors after."""
    n = _counts(cell)
    text = f"{n['right']}/{n['wrong']}/{n['inconclusive']}"
    text = text if n["right"] == len(cell) else f"**{text}**"
    return text + (f" + {n['error']} error" if n["error"] else "")


def _runs(cell: list[dict[str, Any]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for b in cell:
        total.update(run_counts(b, SHAPES[b["shape"]].fixture))
    return total


def cells(res: dict[str, Any]) -> dict[tuple[str, str, bool, str], list[dict[str, Any]]]:
    """The bisections by cell (shape, pace, markers, load), in the order they ran."""
    out: dict[tuple[str, str, bool, str], list[dict[str, Any]]] = {}
    for b in res["bisections"]:
        out.setdefault((b["shape"], b["pace"], b["markers"], b["load"]), []).append(b)
    return out


def _pace_table(res: dict[str, Any]) -> dict[str, Any]:
    by = cells(res)
    m = res["matrix"]
    columns = [(pace, load) for pace in m["paces"] for load in m["loads"]]
    rows = []
    for shape in m["shapes"]:
        for markers in m["markers"]:
            rows.append([shape, _marks(markers)] + [
                _rwi(by[(shape, pace, markers, load)]) if (shape, pace, markers, load) in by
                else "·" for pace, load in columns
            ])  # fmt: skip
    return table(
        "Pace by load: right / wrong / inconclusive bisections of leakyfixture 1.0.0..1.0.9",
        ["shape", "markers", *(f"{pace}, {load}" for pace, load in columns)],
        rows,
        f"{m['repeats']} bisection(s) a cell, each `bisect-cli run --no-attribute` in a fresh "
        "database, first bad 1.0.6. Right: exactly 1.0.5..1.0.6 and no candidate's verdict "
        "against the fixture's truth; wrong: another pair, a false leak on a clean release or "
        "a leaking release called clean; bold: not every bisection right. Paces: "
        + "; ".join(f"{k}: {PACES[k].what}" for k in m["paces"]) + ". docs/bench-pace.md has "
        "every bisection's runs.",
    )  # fmt: skip


def _detail_table(res: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for (shape, pace, markers, load), cell in cells(res).items():
        runs = _runs(cell)
        answers = Counter(_answer(b) for b in cell)
        hog = cell[0].get("hog_cores")
        peak = max((b.get("max_load") or 0.0 for b in cell), default=0.0)
        rows.append([
            shape, pace, _marks(markers), load + (f" ({hog:.1f} cores)" if hog else ""),
            f"{peak:.1f}" if peak else "n/a",
            _rwi(cell), "; ".join(f"{a} ×{n}" for a, n in answers.items()),
            f"{statistics.mean(len(b['runs']) for b in cell):.1f}",
            secs(statistics.mean(b["wall_s"] or 0.0 for b in cell)),
            f"{runs['false_leak']} / {runs['missed']} / {runs['inconclusive_leaking']} / "
            f"{runs['inconclusive_clean']} of {runs['runs']}",
        ])  # fmt: skip
    return table(
        "Every cell: its answers, trials and wall time",
        ["shape", "pace", "markers", "load", "max load", "right/wrong/inconcl.", "answers",
         "runs (mean)",
         "wall s (mean)", "runs: false leak / missed / inconclusive on leaking / on clean"],
        rows,
        "Runs: the run trials of all the cell's bisections, judged against the fixture's "
        "truth. Load: the cores the CPU hog kept busy (its CPU seconds per second). Max load: "
        "the highest 1-minute load average seen during the cell's bisections, whatever ran "
        "(n/a: not recorded).",
    )  # fmt: skip


def _reasons(runs: list[dict[str, Any]], most: int = 2) -> str:
    why = Counter((r["reason"] or "").removeprefix("host inconclusive: ") for r in runs
                  if r["verdict"] == "inconclusive")  # fmt: skip
    return "; ".join(f"{n}× {reason}" for reason, n in why.most_common(most)) or "—"


def _visits(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['version']} {LETTER.get(r['verdict'], r['verdict'])}" for r in runs)


def _defaults_table(res: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for b in res["defaults"]:
        durations = [r["duration_s"] for r in b["runs"] if r["duration_s"] is not None]
        rows.append([
            f"about {b['length']:g} s ({b['work_mib']} MiB a step)", b["load"], _loop(b),
            f"{secs(statistics.median(durations))} ({secs(min(durations))}-"
            f"{secs(max(durations))})" if durations else "n/a",
            _visits(b["runs"]), _reasons(b["runs"]), _answer(b), str(len(b["runs"])),
            secs(b["wall_s"]),
        ])  # fmt: skip
    return table(
        "Unpaced 50-step repros of the fixture at the default options (markers on)",
        ["loop", "load", "loop s (1.0.5, outside)", "run trials s (median, range)",
         "runs in order", "why runs were inconclusive (most common)", "answer", "runs",
         "wall s"],
        rows,
        "Loop: from the first step marker to the last, the repro run by this interpreter "
        "with 1.0.5's wheel on its path under the same load (median of 3). Run trials: the "
        "trials' own durations (interpreter start and import included; a rerun asked for "
        "twice the steps lasts longer). Verdicts: C clean, L leak, P plateau, "
        "? inconclusive.",
    )  # fmt: skip


def _not_measured() -> dict[str, Any]:
    return table(
        "Pace by load",
        ["what", "result"],
        [["every cell", "not measured in quick mode (the matrix takes hours; "
          "`python -m bench.pace --quick` runs one cell, as tests/test_bench_pace.py does)"]],
    )  # fmt: skip


# --------------------------------------------------------------------------------- notes


def _ten_times(b: dict[str, Any]) -> bool:
    """The cell's leak grows at least ten times the threshold over a run's steps."""
    growth = PACES[b["pace"]].steps * SHAPES[b["shape"]].leak_mib_per_step
    return growth >= 10 * THRESHOLD_MIB


def _target_line(bisections: list[dict[str, Any]], res: dict[str, Any]) -> str:
    n = Counter(b["score"] for b in bisections)
    missed = [", ".join(map(str, (s, p, _marks(m), load))) + f": {_rwi(cell)}"
              for (s, p, m, load), cell in cells(res).items()
              if any(b["score"] != "right" for b in cell)]  # fmt: skip
    return (
        f"{n['right']} of {len(bisections)} bisections right, {n['wrong']} wrong, "
        f"{n['inconclusive']} inconclusive, {n['error']} errors"
        + ("; every cell right." if not missed else
           f"; cells not always right (right/wrong/inconclusive): {'; '.join(missed)}.")
    )  # fmt: skip


def _runs_line(bisections: list[dict[str, Any]]) -> str:
    runs = _runs(bisections)
    big = _runs([b for b in bisections if _ten_times(b)])
    ten = f"leaks that grow ten times the threshold ({THRESHOLD_MIB:g} MiB) or more over a run"
    return (
        f"Runs: {runs['false_leak']} false leaks in {runs['runs'] - runs['leaking_runs']} runs "
        f"of clean releases; {runs['missed']} of {runs['leaking_runs']} runs of leaking "
        f"releases called clean or a plateau and {runs['inconclusive_leaking']} inconclusive; "
        + (f"{big['inconclusive_leaking']} inconclusive of {big['leaking_runs']} runs of {ten} "
           "(the spike workload at 50 steps)." if big["leaking_runs"] else
           f"no cell of {ten} was measured (the spike workload at 50 steps is one).")
    )  # fmt: skip


def notes(res: dict[str, Any]) -> list[str]:
    """What the numbers say, from the stored results."""
    if not res["bisections"] and not res["defaults"]:
        return ["Not measured in quick mode."]
    out = []
    if res["bisections"]:
        out += [_target_line(res["bisections"], res), _runs_line(res["bisections"])]
    for d in res["defaults"]:
        inconclusive = sum(r["verdict"] == "inconclusive" for r in d["runs"])
        out.append(
            f"Unpaced 50 steps of about {d['length']:g} s ({_loop(d)} s measured), {d['load']}: "
            f"{_answer(d)}, {len(d['runs'])} runs, {inconclusive} inconclusive, "
            f"{secs(d['wall_s'])} s."
        )
    return out


# -------------------------------------------------------------------------------- report


def _bisection_lines(found: list[dict[str, Any]]) -> list[str]:
    lines = []
    for b in found:
        which = b["label"] + (f" #{b['repeat']}" if "repeat" in b else "")
        lines.append(f"- {which}: **{b['score']}**, {_answer(b)}; {len(b['runs'])} runs in "
                     f"{secs(b['wall_s'])} s: {_visits(b['runs']) or 'none'}")  # fmt: skip
        if any(r["verdict"] == "inconclusive" for r in b["runs"]):
            lines.append(f"  - inconclusive: {_reasons(b['runs'], most=3)}")
    return lines


def render(res: dict[str, Any]) -> str:
    """docs/bench-pace.md from a stamped section: notes, tables, every bisection's runs."""
    under = footer(res) + f" <sub>Code: {res['machine'].get('revision', 'unknown')}.</sub>"
    lines = ["# Pace and load", "", INTROS["pace"], "", "What it shows:", ""]
    lines += [f"- {n}" for n in notes(res)] + [""]
    tables = [_pace_table(res), _detail_table(res)] if res["bisections"] else []
    for t in [*tables, *([_defaults_table(res)] if res["defaults"] else [])]:
        lines.append(md_table(t, under))
    lines += ["## Every bisection", "", "Verdicts: C clean, L leak, P plateau, ? inconclusive.", ""]
    lines += _bisection_lines(res["bisections"] + res["defaults"])
    lines += ["", "Written by `bench/pace.py` (its docstring says how each cell is run and "
              "scored).", ""]  # fmt: skip
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main


def _names(ap: argparse.ArgumentParser, flag: str, text: str, known: list[str]) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        ap.error(f"{flag}: unknown {', '.join(unknown) or 'nothing given'}; "
                 f"known: {', '.join(known)}")  # fmt: skip
    return names


def matrix_of(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Matrix:
    """The cells the options ask for, each refused in one line when it is not known."""
    if args.quick:
        return QUICK
    if args.repeats < 1:
        ap.error(f"--repeats: {args.repeats}; allowed are 1 or more")
    markers = _names(ap, "--markers", args.markers, ["with", "without"])
    loads = _names(ap, "--loads", args.loads, [x.replace(" ", "-") for x in LOADS])
    lengths = [] if args.lengths == "none" else _names(ap, "--lengths", args.lengths,
                                                         [f"{x:g}" for x in DEFAULTS])  # fmt: skip
    return Matrix(
        shapes=tuple(_names(ap, "--shapes", args.shapes, list(SHAPES))),
        paces=tuple(_names(ap, "--paces", args.paces, list(PACES))),
        markers=tuple(m == "with" for m in markers),
        loads=tuple(x.replace("-", " ") for x in loads),
        repeats=args.repeats,
        lengths=tuple(float(x) for x in lengths),
        default_loads=tuple(x.replace("-", " ") for x in loads),
        warm_up=not args.no_warm_up,
    )


def parser() -> argparse.ArgumentParser:
    """`python -m bench.pace`'s options (`matrix_of` reads the cells from them)."""
    ap = argparse.ArgumentParser(prog="python -m bench.pace", description=__doc__.split("\n")[0])
    add = ap.add_argument
    add("--repeats", type=int, default=3, help="bisections a cell (default 3)")
    add("--shapes", default=",".join(SHAPES), help=f"some of {','.join(SHAPES)} (default: all)")
    add("--paces", default=",".join(PACES), help=f"some of {','.join(PACES)} (default: all)")
    add("--markers", default="with,without", help="with, without or both (default)")
    add("--loads", default="idle,cpu-hog",
        help="idle, cpu-hog or both (default); the defaults table's too")  # fmt: skip
    add("--lengths", default="0.3,2",
        help="the defaults table's unpaced loops: about 0.3 and/or 2 s (default both), "
        "or none")  # fmt: skip
    add("--no-warm-up", action="store_true",
        help="count each shape's first bisection, which builds the environments")  # fmt: skip
    add("--quick", action="store_true",
        help="one cell (steady, unpaced, markers, idle, one bisection) and the defaults "
        "table's 0.3 s idle row; the options above do not apply")  # fmt: skip
    add("--render", action="store_true",
        help="measure nothing: rewrite bench-pace.md and benchmarks.md from "
        "OUT/bench/results.json")  # fmt: skip
    add("--out", type=Path, default=None,
        help="directory for bench-pace.md and benchmarks.md (default docs/; required "
        "with --quick)")  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = parser()
    args = ap.parse_args(argv)
    if args.quick and args.out is None:
        ap.error("--quick needs --out DIR (a quick run must not overwrite docs/)")
    out = args.out or DEFAULT_OUT
    if args.render:
        return _render(ap, out)
    matrix = matrix_of(ap, args)
    command = shlex.join(["uv", "run", "python", "-m", "bench.pace", *argv])
    cfg = Config(quick=args.quick, out=out, command=command)
    md = merge(out, "pace", run(cfg, matrix))
    cfg.log(f"wrote {out / 'bench-pace.md'} and {md}")
    return 0


def _render(ap: argparse.ArgumentParser, out: Path) -> int:
    stored = out / "bench" / "results.json"
    sec = json.loads(stored.read_text()).get("pace") if stored.exists() else None
    if not sec or not sec.get("bisections") and not sec.get("defaults"):
        ap.error(f"--render: no measured pace section in {stored}; run the benchmark first")
    write_report(out / "bench-pace.md", render(sec))
    md = merge(out, "pace", {**sec, "tables": tables(sec)})
    print(f"rewrote {out / 'bench-pace.md'} and {md} from {stored}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
