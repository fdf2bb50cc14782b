"""7. Verdicts under a noisy neighbour: the same bisections and shapes, idle and loaded.

A shared CI runner or a busy GPU node is the normal case, so a verdict is only worth
something if it holds on a loaded machine. Three conditions (bench/hogs.py):

- **idle**: nothing else of ours runs (the machine's other load is in the footer);
- **cpu hog**: one busy process per core (`cpu_hog()`), at normal priority;
- **memory pressure**: another process holding half the memory available at the start
  (at most 8 GiB, `pressure_mib()`), written and written again (`memory_pressure()`);
  trials keep their own cap.

Measured under each: `bisect-cli run --no-attribute` (a fresh database, the environments
of a first, uncounted run reused, so wall time is the search alone) of the offline
fixture (leakyfixture 1.0.0..1.0.9, first bad 1.0.6) and of the two real-package-shaped
packages of `service.example.realistic` (heavyfixture 2.0.0..2.0.4, first bad 2.0.3;
ckptfixture 0.11.8..0.11.12, first bad 0.11.9; both import numpy and scipy and write
200 MiB before the repro's first marker), served with --find-links beside uv's default
index; and every script of `service.example.shapes` once, judged as a runner would
(`run_shape`). The quick run (CI's) measures nothing here and says so: the section takes
about 15 minutes, and tests/test_neighbours_e2e.py runs the same bisections in CI.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psutil

from bench.common import Config, clean_env, reachable_tmpdir, secs, stopwatch, table
from bench.e2e import REPRO
from bench.hogs import MIB, Neighbour, cpu_hog, memory_pressure, pressure_mib
from service.example.fixture import build_fixture
from service.example.index import serve_index
from service.example.realistic import REPROS, SPECS, build_realistic
from service.example.shapes import SHAPES, run_shape

CONDITIONS = ("idle", "cpu hog", "memory pressure")
LETTER = {"clean": "C", "leak": "L", "plateau": "P", "inconclusive": "?", "skip": "S",
          "error": "E", None: "·"}  # fmt: skip


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("bisect-cli")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "service.cli"]


def neighbour(condition: str, pressure: int) -> AbstractContextManager[Neighbour | None]:
    if condition == "cpu hog":
        return cpu_hog()
    if condition == "memory pressure":
        return memory_pressure(pressure)
    return nullcontext()


@contextmanager
def watched() -> Iterator[dict[str, float]]:
    """The least memory available and the highest 1-minute load seen while the block runs."""
    seen = {"min_available_mib": psutil.virtual_memory().available / MIB, "max_load": 0.0}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            seen["min_available_mib"] = min(
                seen["min_available_mib"], psutil.virtual_memory().available / MIB
            )
            seen["max_load"] = max(seen["max_load"], os.getloadavg()[0])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def bisection(package: str, where: list[str], script: Path, span: str, work: Path,
              run_dir: Path) -> dict[str, Any]:  # fmt: skip
    """One `bisect-cli run` with environments and uv cache under `work`, its database and
    answer under `run_dir`: the answer, and each run trial in order (`visited`, `runs`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    db = run_dir / "results.db"
    env = clean_env(BISECT_CACHE_DIR=str(work / "cache"), BISECT_DATA_DIR=str(run_dir))
    cmd = [*_cli(), "run", str(script), "--package", package, "--range", span, *where,
           "--database-url", f"sqlite:///{db}", "--json", "--no-attribute"]  # fmt: skip
    with stopwatch() as w:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(f"bisect-cli gave no JSON (exit {proc.returncode}): "
                           f"{proc.stderr[-800:]}") from None  # fmt: skip
    con = sqlite3.connect(db)
    runs = con.execute(
        "select c.version, t.verdict, t.duration_s, t.analysis, t.hints from trial t "
        "join candidate c on c.id = t.candidate_id where t.kind = 'run' order by t.id"
    ).fetchall()
    con.close()
    return {
        "wall_s": w["s"],
        "exit_code": proc.returncode,
        "status": report.get("status"),
        "message": report.get("message"),
        "last_good": report.get("last_good"),
        "first_bad": report.get("first_bad"),
        "verdicts": {c["version"]: c["verdict"] for c in report.get("candidates", [])},
        "visited": [[version, verdict] for version, verdict, *_ in runs],
        "runs": [_run(*row) for row in runs],
        "stopped_early": sum(
            1 for e in report.get("evidence", []) for r in e["runs"] if r.get("stopped_early")
        ),
    }


def _run(version: str, verdict: str | None, duration_s: float | None, analysis: str | None,
         hints: str | None) -> dict[str, Any]:  # fmt: skip
    """One run trial of a bisection: its verdict, why, how long, how many steps it was asked."""
    judged = json.loads(analysis) if analysis else None
    return {"version": version, "verdict": verdict, "duration_s": duration_s,
            "reason": (judged or {}).get("reason"),
            "steps_hint": json.loads(hints or "{}").get("LEAKBISECT_STEPS")}  # fmt: skip


def _targets(work: Path, fixture_url: str) -> list[dict[str, Any]]:
    """What is bisected: (package, where it is served, repro, range, truth)."""
    out = [{"package": "leakyfixture", "where": ["--index-url", fixture_url], "repro": REPRO,
            "span": "1.0.0..1.0.9", "truth": "1.0.6"}]  # fmt: skip
    for name, spec in SPECS.items():
        wheels = build_realistic(work / "wheels" / name, spec)
        out.append({"package": name, "where": ["--find-links", str(wheels)],
                    "repro": REPROS[name], "span": spec.span(),
                    "truth": spec.first_leaking})  # fmt: skip
    return out


def _bisections(cfg: Config, work: Path, pressure: int) -> list[dict[str, Any]]:
    runs = []
    with serve_index(build_fixture(work / "wheels" / "leakyfixture")) as url:
        for target in _targets(work, url):
            name, home = target["package"], work / target["package"]
            args = (name, target["where"], target["repro"], target["span"], home)
            cfg.log(f"neighbours: {name}: first run, environments built (not counted)")
            bisection(*args, home / "warm-up")
            for condition in CONDITIONS:
                cfg.log(f"neighbours: {name} {target['span']}, {condition}")
                with neighbour(condition, pressure) as hog, watched() as seen:
                    run = bisection(*args, home / condition.replace(" ", "-"))
                runs.append({"package": name, "span": target["span"], "truth": target["truth"],
                             "condition": condition, "neighbour": hog and hog.what,
                             **seen, **run})  # fmt: skip
    return runs


def _shapes(cfg: Config, work: Path, pressure: int) -> list[dict[str, Any]]:
    runs = []
    for condition in CONDITIONS:
        cfg.log(f"neighbours: the {len(SHAPES)} shapes, {condition}")
        with neighbour(condition, pressure):
            for name, shape in SHAPES.items():
                r = run_shape(shape, work / "shapes" / condition.replace(" ", "-") / name)
                runs.append({"shape": name, "truth": shape.truth, "condition": condition,
                             "verdict": r.verdict, "early_stop": r.early_stop,
                             "rule_stop": r.rule_stop, "first_marker_s": r.first_marker_s,
                             "duration_s": r.duration_s, "reason": r.reason})  # fmt: skip
    return runs


def run(cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {"title": "7. Verdicts under a noisy neighbour", "quick": cfg.quick}
    if cfg.quick:
        out["bisections"], out["shapes"] = [], []
        out["tables"] = [_not_measured()]
        return out
    pressure = pressure_mib()
    out["pressure_mib"] = pressure
    with reachable_tmpdir(prefix="bench-neighbours-") as tmp:
        work = Path(tmp)
        out["bisections"] = _bisections(cfg, work, pressure)
        out["shapes"] = _shapes(cfg, work, pressure)
    out["tables"] = [_bisection_table(out["bisections"]), _shape_table(out["shapes"])]
    return out


def _not_measured() -> dict[str, Any]:
    return table(
        "Bisections and shapes, idle and loaded",
        ["what", "result"],
        [["every condition", "not measured in quick mode (a full run takes about 15 minutes; "
          "tests/test_neighbours_e2e.py runs the bisections in CI)"]],
    )  # fmt: skip


def _cells(visited: list[list[str]]) -> str:
    return ", ".join(f"{v} {LETTER.get(verdict, verdict)}" for v, verdict in visited)


def _answer(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["status"], r["first_bad"], r["verdicts"], r["visited"])


def _bisection_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    idle = {r["package"]: r for r in runs if r["condition"] == "idle"}
    rows = []
    for r in runs:
        same = _answer(r) == _answer(idle[r["package"]])
        right = "right" if r["first_bad"] == r["truth"] else "**wrong**"
        rows.append([
            f"{r['package']} {r['span']} (first bad {r['truth']})", r["condition"],
            f"{r['first_bad'] or r['status']} ({right})",
            " ".join(f"{v} {LETTER.get(x, x)}" for v, x in r["verdicts"].items()),
            _cells(r["visited"]), secs(r["wall_s"]), f"{r['max_load']:.1f}",
            f"{r['min_available_mib'] / 1024:.1f}",
            "—" if r["condition"] == "idle" else ("yes" if same else "**no**"),
        ])  # fmt: skip
    return table(
        "Bisections: the answer idle, with a CPU hog on every core, under memory pressure",
        ["package, range", "condition", "first bad", "verdict per candidate",
         "runs in order", "wall s", "max load", "min GiB available", "identical to idle"],
        rows,
        "Verdicts: C clean, L leak, P plateau, ? inconclusive, · not run. Identical: the same "
        "status, first bad, verdict per candidate and runs in the same order as idle. Wall "
        "time: the search with the environments already built.",
    )  # fmt: skip


def _shape_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(r["shape"], r["condition"]): r for r in runs}
    rows = []
    for name, shape in SHAPES.items():
        seen = [by[(name, c)] for c in CONDITIONS if (name, c) in by]
        cells = [r["verdict"] + (" (stopped early)" if r["early_stop"] else "") for r in seen]
        markers = " / ".join(secs(r["first_marker_s"]) for r in seen)
        stops = [r for r in seen if r["rule_stop"]]
        rule = "never" if not stops else " / ".join(
            f"{r['rule_stop'][0]:.1f} s" for r in stops
        )  # fmt: skip
        rows.append([name, shape.truth, *cells, markers, rule,
                     "yes" if len({r["verdict"] for r in seen}) == 1 else "**no**"])  # fmt: skip
    return table(
        "Shapes: the classifier's verdict per condition (service.example.shapes)",
        ["shape", "truth", *CONDITIONS, "first marker s", "leak rule alone stops at",
         "same verdict"],
        rows,
        "Stopped early: early stopping as the service sets it for a later trial of the job "
        "would have ended the run (never: a horizon of seconds is under MIN_HORIZON_S). The "
        "leak rule alone: the same replay with that bound lifted, per condition where it "
        "stopped. It judges only what comes after the first marker, so a leak stops after it; "
        "on runs of seconds a bounded shape whose memory still rises at the first look (threads "
        "starting until 40 % of the run) can stop too, which is why the bound exists.",
    )  # fmt: skip


def notes(res: dict[str, Any]) -> list[str]:
    """What the numbers say, from the stored results."""
    if res.get("quick"):
        return ["Not measured in quick mode."]
    out = []
    b = res["bisections"]
    idle = {r["package"]: r for r in b if r["condition"] == "idle"}
    loaded = [r for r in b if r["condition"] != "idle"]
    same = [r for r in loaded if _answer(r) == _answer(idle[r["package"]])]
    right = [r for r in b if r["first_bad"] == r["truth"]]
    pressed = [r for r in b if r["condition"] == "memory pressure"] or b
    out.append(
        f"{len(same)} of {len(loaded)} loaded bisections gave exactly the idle answer (verdict "
        f"per candidate, runs in order, first bad); {len(right)} of {len(b)} bisections found "
        f"the true first bad release. Memory pressure: {res['pressure_mib'] / 1024:.1f} GiB "
        "held by another process (the least memory available during those bisections: "
        f"{min(r['min_available_mib'] for r in pressed) / 1024:.1f} GiB)."
    )
    for condition in CONDITIONS[1:]:
        pairs = [(idle[r["package"]]["wall_s"], r["wall_s"]) for r in loaded
                 if r["condition"] == condition]  # fmt: skip
        if pairs:
            out.append(
                f"Wall time, {condition} over idle: "
                + ", ".join(f"{after / before:.2f}x" for before, after in pairs)
                + " (the packages in table order)."
            )
    s = res["shapes"]
    bounded = [r for r in s if r["truth"] == "bounded"]
    leaks = [r for r in s if r["truth"] == "leak"]
    out.append(
        f"Shapes: {sum(r['verdict'] == 'leak' for r in bounded)} of {len(bounded)} runs of "
        f"bounded shapes called a leak, {sum(r['verdict'] == 'leak' for r in leaks)} of "
        f"{len(leaks)} runs of leak shapes found; early stopping would have stopped "
        f"{sum(bool(r['early_stop']) for r in s)} of {len(s)} runs (horizons of seconds). "
        + _rule_alone(bounded, leaks)
    )
    return out


def _rule_alone(bounded: list[dict[str, Any]], leaks: list[dict[str, Any]]) -> str:
    """What the leak rule did with the short-horizon bound lifted."""
    stopped = [r for r in bounded if r["rule_stop"]]
    after = [r for r in leaks if r["rule_stop"] and r["rule_stop"][0] > r["first_marker_s"]]
    names = sorted({r["shape"] for r in stopped})
    return (
        f"With the short-horizon bound (MIN_HORIZON_S) lifted the leak rule stopped "
        f"{len(after)} of {len(leaks)} leak runs, "
        f"each after its first marker, and {len(stopped)} of {len(bounded)} bounded runs"
        + (f" ({', '.join(names)}: on a run of seconds, the reason for the bound)" if names else "")
        + "."
    )
