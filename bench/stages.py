"""The stages beyond the release: ddmin's mixes against changed packages, what tracing costs,
and the trials and wall time of each end-to-end test scenario.

    uv run python bench/stages.py [--repeats 3] [--scenarios all|none|KEY,...] [--no-warm-up]
                                  [--report docs/bench-stages.md]

1. ddmin (pure, no environments): `service.ddmin.step` driven to its answer with one slot
   for every single culprit and every interacting pair among n changes (n = 1..16),
   counting the mixes asked, the two ends included, against
   `worst_case_tests(n)` (the bound the README states).
2. Tracing: the bundled repro (`service/example/repro.py`) on leakyfixture 1.0.6 in one uv
   environment (with memray, as an attribute trial's), run `--repeats` times each under the
   sampler as a run trial does, under tracemalloc, and under memray (the trial's helper,
   `runners/tracehelper.py`), all with the same memory cap and no early stopping. Figures
   are the script's wall time as the sampler measured it (`duration_s`), median and range.
3. Scenarios: each end-to-end scenario of tests/test_stages_e2e.py and
   tests/test_attribute_e2e.py run as those tests run it (`bisect-cli run`, a fresh home and
   database, the uv cache shared and warmed by one uncounted run of the same scenario),
   with the wall time of the whole command, the trials by kind from its database, the
   traced runs' durations against the untraced runs of the same boundary pair, and the
   answer. The attribution scenarios install memray from PyPI.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from runners.executor import run_script
from runners.tracing import MEMRAY_REQUIREMENT, helper_args
from service.ddmin import Change, Need, Outcome, step, worst_case_tests
from service.example.fixture import FixtureSpec, build_fixture
from service.example.gitrepo import build_repo
from service.example.index import serve_index
from service.example.suite import SCENARIOS, build_suite

ROOT = Path(__file__).resolve().parents[1]

REPRO = ROOT / "service" / "example" / "repro.py"
HELPER = ROOT / "runners" / "tracehelper.py"
SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16)
CAP = 2 * 1024**3


def mixes(n: int, leaks: Callable[[frozenset[str]], bool]) -> int:
    """How many configurations one-slot ddmin asks for, the ends included."""
    changes = [Change(f"p{i}", "1", "2") for i in range(n)]
    known: dict[frozenset[str], Outcome] = {}
    while isinstance(answer := step(changes, known, 1), Need):
        for config in answer.configs:
            known[config] = Outcome.LEAK if leaks(config) else Outcome.CLEAN
    return len(known)


def ddmin_counts() -> list[dict[str, Any]]:
    rows = []
    for n in SIZES:
        singles = [mixes(n, lambda c, i=i: f"p{i}" in c) for i in range(n)]
        pairs = [mixes(n, lambda c, a=a, b=b: {f"p{a}", f"p{b}"} <= c)
                 for a, b in itertools.combinations(range(n), 2)]  # fmt: skip
        rows.append({"n": n, "bound": worst_case_tests(n), "single": singles, "pair": pairs})
    return rows


def environment(work: Path) -> Path:
    """leakyfixture 1.0.6 and memray in one venv; its python."""
    wheels = build_fixture(work / "wheels")
    venv = work / "venv"
    subprocess.run(["uv", "venv", "--quiet", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(python),
                    "leakyfixture==1.0.6", MEMRAY_REQUIREMENT, "--find-links", str(wheels)],
                   check=True)  # fmt: skip
    return python


def timed(python: Path, work: Path, tracer: str | None) -> float:
    if tracer is None:
        script, args = REPRO, []
    else:
        script, args = HELPER, helper_args(tracer, work / f"{tracer}.json", REPRO)  # type: ignore[arg-type]
    ex = run_script(str(python), script, cwd=work, timeout_s=600, memory_limit_bytes=CAP,
                    run_as=None, args=args)  # fmt: skip
    if ex.exit_code != 0:
        raise SystemExit(f"{tracer or 'untraced'} run failed ({ex.exit_code}): {ex.log_tail}")
    return ex.duration_s


def tracing_costs(repeats: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        work = Path(tmp)
        python = environment(work)
        out: dict[str, list[float]] = {"untraced": [], "tracemalloc": [], "memray": []}
        for _ in range(repeats):  # interleaved, so drift hits all three alike
            for name in out:
                out[name].append(timed(python, work, None if name == "untraced" else name))
        return out


# (key, title, how to make its inputs under a directory): the `bisect-cli run` arguments,
# and a directory of wheels to serve as its index, when the scenario has one.
Scenario = tuple[str, str, Callable[[Path], tuple[list[str], Path | None]]]


def _dependency(name: str) -> Scenario:
    def make(home: Path) -> tuple[list[str], Path | None]:
        suite = build_suite(home / "suite", name)
        args = ["run", str(suite.repro), "--from", str(suite.good), "--to", str(suite.bad),
                "--no-attribute"]  # fmt: skip
        return args, suite.find_links

    return name, f"which dependency: {name}", make


def _attribute(via: str) -> Scenario:
    def make(home: Path) -> tuple[list[str], Path | None]:
        wheels = build_fixture(home / "wheels", FixtureSpec(leak_via=via))
        return ["run", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.6",
                "--find-links", str(wheels)], None  # fmt: skip

    return via, f"which allocation site: {via} leak", make


def _commits(home: Path) -> tuple[list[str], Path | None]:
    repo = build_repo(home / "repo", commits=12, leaking=7, broken=9)
    args = ["run", str(REPRO), "--package", "leakyfixture", "--range", "1.0.5..1.0.7",
            "--commits", "--repo", str(repo.path), "--no-attribute"]  # fmt: skip
    return args, build_fixture(home / "wheels")


SCENARIO_LIST: list[Scenario] = [
    *(_dependency(name) for name in SCENARIOS),
    *(_attribute(via) for via in ("python", "native")),
    ("commits", "which commit: 12 commits, one unbuildable", _commits),
]


def run_scenario(work: Path, make: Callable[[Path], tuple[list[str], Path | None]],
                 uv_cache: Path) -> dict[str, Any]:  # fmt: skip
    """One `bisect-cli run` of a scenario in a fresh home: its wall time, trials and answer."""
    home = Path(tempfile.mkdtemp(prefix="scenario-", dir=work))
    home.chmod(0o755)  # the trial and build users reach the environments under it
    args, index_dir = make(home)
    db = home / "r.db"
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"),
           "XDG_CACHE_HOME": str(home / "cache"), "UV_CACHE_DIR": str(uv_cache)}  # fmt: skip
    with serve_index(index_dir) if index_dir else nullcontext(None) as index:
        extra = ["--index-url", index] if index else []
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", *args, *extra,
             "--database-url", f"sqlite:///{db}", "--json"],
            capture_output=True, text=True, env=env, timeout=1800,
        )  # fmt: skip
        wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{args[:2]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"wall_s": wall, **_trials(db), "answer": _answer(json.loads(done.stdout))}


def _trials(db: Path) -> dict[str, Any]:
    """Trials by kind (runs by stage), and the boundary pair's traced and untraced seconds."""
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "select t.kind, c.stage, t.trace, t.duration_s, t.exit_code, c.id from trial t "
            "join candidate c on c.id = t.candidate_id where t.status = 'done' order by t.id"
        ).fetchall()
    runs: dict[str, int] = {}
    for kind, stage, *_ in rows:
        if kind == "run":
            runs[stage or "releases"] = runs.get(stage or "releases", 0) + 1
    traced = {r[5] for r in rows if r[0] == "attribute"}
    timing: dict[str, list[float]] = {}
    for _kind, _stage, trace, seconds, exit_code, cid in rows:
        if cid in traced and exit_code is not None and seconds:
            timing.setdefault(trace or "untraced", []).append(seconds)
    return {
        "runs": runs,
        "traced": sum(1 for r in rows if r[0] == "attribute"),
        "listings": sum(1 for r in rows if r[0] == "commits"),
        "boundary_seconds": {k: statistics.median(v) for k, v in timing.items()},
    }


def _answer(report: dict[str, Any]) -> str:
    found = report.get("dependency") or {}
    commit = report.get("commit") or {}
    if commit.get("first_bad"):
        return f"{commit['first_bad']['sha'][:12]} {commit['first_bad']['subject']}"
    traced = report.get("attribution") or {}
    if traced:
        return traced.get("message", "")
    culprits = ", ".join(c["name"] for c in found.get("culprits", []))
    return f"{culprits}; first bad {report.get('package')} {report.get('first_bad')}"


SCENARIO_KEYS = tuple(key for key, _, _ in SCENARIO_LIST)


def scenario_rows(keys: Sequence[str], warm_up: bool = True) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-scenarios-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        uv_cache = work / "uv-cache"
        uv_cache.mkdir(mode=0o755)
        rows = []
        for key, name, make in SCENARIO_LIST:
            if key not in keys:
                continue
            if warm_up:
                run_scenario(work, make, uv_cache)  # fills the uv cache, not counted
            rows.append({"name": name, **run_scenario(work, make, uv_cache)})
            print(f"{name}: {rows[-1]['wall_s']:.1f} s", file=sys.stderr)
        return rows


STAGE_WORDS = {"mix": "mixes", "releases": "releases", "commit": "commits"}


def _scenario_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Scenarios: the end-to-end tests' runs",
        "",
        "Each after an uncounted warm-up run that fills the uv cache (unless `--no-warm-up`);"
        " judged runs by stage (the mixes, the releases, the commits).",
        "",
        "| scenario | wall s | judged runs | traced runs | commit listings | answer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        runs = " + ".join(f"{n} {STAGE_WORDS.get(stage, stage)}" for stage, n in r["runs"].items())
        lines.append(f"| {r['name']} | {r['wall_s']:.1f} | {runs} | {r['traced']} | "
                     f"{r['listings']} | {r['answer']} |")  # fmt: skip
    lines += [
        "",
        "Tracing on the boundary runs (median script seconds of the same two releases):",
        "",
        "| scenario | untraced | tracemalloc | memray |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        t = r["boundary_seconds"]
        if "tracemalloc" in t:
            cells = [
                f"{t[k]:.2f} s" if k in t else "-" for k in ("untraced", "tracemalloc", "memray")
            ]
            lines.append(f"| {r['name']} | {' | '.join(cells)} |")
    return lines


def _mean_max(values: list[int]) -> str:
    return f"{statistics.mean(values):.2f} / {max(values)}" if values else ""


def report(
    path: Path,
    rows: list[dict[str, Any]],
    costs: dict[str, list[float]],
    scenarios: list[dict[str, Any]] | None = None,
) -> str:
    base = statistics.median(costs["untraced"])
    lines = [
        "# Stages beyond the release: ddmin mixes and tracing cost",
        "",
        "Written by `uv run python bench/stages.py`; "
        f"Python {platform.python_version()}, {platform.machine()}, {platform.system()}.",
        "",
        "## ddmin: mixes asked with one runner, the two ends included",
        "",
        "| changed packages | bound (README) | one culprit: mean / max | "
        "two interacting: mean / max | pairs tried |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['n']} | {r['bound']} | {_mean_max(r['single'])} | "
                     f"{_mean_max(r['pair'])} | {len(r['pair'])} |")  # fmt: skip
    lines += [
        "",
        "## Tracing: the bundled repro on leakyfixture 1.0.6 (40 steps)",
        "",
        "| run | median s | min..max s | vs untraced |",
        "| --- | --- | --- | --- |",
    ]
    for name, values in costs.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {median:.2f} | {min(values):.2f}..{max(values):.2f} | "
                     f"{median / base:.2f}x |")  # fmt: skip
    lines += ["", f"{len(costs['untraced'])} runs each, interleaved."]
    if scenarios:
        lines += _scenario_lines(scenarios)
    text = "\n".join([*lines, ""])
    path.write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each kind (default 3)")
    ap.add_argument("--report", type=Path, default=ROOT / "docs" / "bench-stages.md")
    ap.add_argument(
        "--scenarios",
        default="all",
        help=f"section 3's scenarios, comma-separated, of {','.join(SCENARIO_KEYS)}; "
        "'all' (the default, about 10 minutes) or 'none'",
    )
    ap.add_argument("--no-warm-up", action="store_true",
                    help="section 3: no uncounted first run of each scenario")  # fmt: skip
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats: must be at least 1")
    keys = {"all": SCENARIO_KEYS, "none": ()}.get(args.scenarios) or args.scenarios.split(",")
    unknown = sorted(set(keys) - set(SCENARIO_KEYS))
    if unknown:
        ap.error(f"--scenarios: unknown {', '.join(unknown)}; choose from "
                 f"{', '.join(SCENARIO_KEYS)}, all or none")  # fmt: skip
    rows = ddmin_counts()
    costs = tracing_costs(args.repeats)
    scenarios = scenario_rows(keys, warm_up=not args.no_warm_up) if keys else None
    print(report(args.report, rows, costs, scenarios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
