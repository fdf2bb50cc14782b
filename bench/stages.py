"""The stages beyond the release: ddmin's mixes against changed packages, and what tracing costs.

    uv run python bench/stages.py [--repeats 3] [--report docs/bench-stages.md]

1. ddmin (pure, no environments): `service.ddmin.step` driven to its answer with one slot
   for every single culprit and every interacting pair among n changes (n = 1..16),
   counting the mixes asked, the two ends included, against
   `worst_case_tests(n)` (the bound the README states).
2. Tracing: the bundled repro (`service/example/repro.py`) on leakyfixture 1.0.6 in one uv
   environment (with memray, as an attribute trial's), run `--repeats` times each under the
   sampler as a run trial does, under tracemalloc, and under memray (the trial's helper,
   `runners/tracehelper.py`), all with the same memory cap and no early stopping. Figures
   are the script's wall time as the sampler measured it (`duration_s`), median and range.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runners.executor import run_script
from runners.tracing import MEMRAY_REQUIREMENT, helper_args
from service.ddmin import Change, Need, Outcome, step, worst_case_tests
from service.example.fixture import build_fixture

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


def _mean_max(values: list[int]) -> str:
    return f"{statistics.mean(values):.2f} / {max(values)}" if values else ""


def report(path: Path, rows: list[dict[str, Any]], costs: dict[str, list[float]]) -> str:
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
    lines += ["", f"{len(costs['untraced'])} runs each, interleaved.", ""]
    text = "\n".join(lines)
    path.write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each kind (default 3)")
    ap.add_argument("--report", type=Path, default=ROOT / "docs" / "bench-stages.md")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats: must be at least 1")
    rows = ddmin_counts()
    print(report(args.report, rows, tracing_costs(args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
