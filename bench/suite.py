"""Where the test suite's time goes: ``uv run python -m bench.suite [--out FILE]
[--durations FILE] [-- PYTEST_ARGS...]``.

Runs ``pytest`` (pyproject's addopts: the workers, ``--dist loadfile``, the scheduler of
``tests/schedule.py``) with the `bench.suite_plugin` plugin, then writes:

- ``--out`` (default ``docs/bench-suite.md``): the run's wall time and pytest's summary
  line; the CPU the whole machine spent over it (``/proc/stat``, so containers, Slurm jobs
  and Postgres count) against what two busy cores could give; each worker's busy time and
  the modules it ran last; the modules by wall time with their CPU (the worker's own and its
  reaped children's), tests and start.
- ``--durations`` (default ``tests/durations.json``): each module's wall seconds, which the
  scheduler reads to start the longest modules first; the modules this run measured are
  updated, the others kept. Refresh it after adding a slow module.

Arguments after ``--`` go to pytest (``-- tests/test_units.py -n 2`` measures two workers on
one module); the run's own exit status is the bench's, after the report is written.
A module's CPU leaves out what ran outside its worker's process tree (containers, Slurm jobs,
servers it did not start); the machine's figure holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "bench-suite.md"
DEFAULT_DURATIONS = ROOT / "tests" / "durations.json"
TOP = 30  # modules listed by name in the report


def run_suite(pytest_args: list[str], profile: Path) -> tuple[int, str, float]:
    """pytest with the plugin: (exit status, its last summary line, wall seconds)."""
    env = {**os.environ, "SUITE_PROFILE_OUT": str(profile)}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "bench.suite_plugin", *pytest_args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    sys.stdout.write(proc.stdout)
    summary = [ln for ln in proc.stdout.splitlines() if re.match(r"^=+ .* in [\d.]+s", ln)]
    return proc.returncode, (summary[-1].strip("= ") if summary else "no summary line"), wall


def read_profile(profile: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The modules' lines and the controller's line (machine busy time)."""
    lines = [json.loads(ln) for ln in profile.read_text().splitlines() if ln.strip()]
    whole = next((r for r in lines if r["module"] == "*"), {})
    return [r for r in lines if r["module"] != "*"], whole


def workers_table(modules: list[dict[str, Any]], t0: float) -> list[str]:
    rows = ["| worker | modules | busy s | ends at s | its last three modules |",
            "|---|---|---|---|---|"]  # fmt: skip
    for worker in sorted({r["worker"] for r in modules}):
        mine = sorted((r for r in modules if r["worker"] == worker), key=lambda r: r["start"])
        busy = sum(r["wall_s"] for r in mine)
        end = max(r["start"] + r["wall_s"] for r in mine) - t0
        last = ", ".join(Path(r["module"]).stem for r in mine[-3:])
        rows.append(f"| {worker} | {len(mine)} | {busy:.0f} | {end:.0f} | {last} |")
    return rows


def modules_table(modules: list[dict[str, Any]], t0: float) -> list[str]:
    rows = ["| module | wall s | CPU s (own + children) | tests | worker | started at s |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(modules, key=lambda r: -r["wall_s"])[:TOP]:
        cpu = r["own_cpu_s"] + r["child_cpu_s"]
        rows.append(
            f"| {Path(r['module']).name} | {r['wall_s']:.1f} | {cpu:.1f} "
            f"({r['own_cpu_s']:.1f} + {r['child_cpu_s']:.1f}) | {r['tests']} | {r['worker']} "
            f"| {r['start'] - t0:.0f} |"
        )
    return rows


def report(modules: list[dict[str, Any]], whole: dict[str, Any], summary: str, wall: float,
           command: str) -> str:  # fmt: skip
    t0 = min(r["start"] for r in modules)
    info = machine()
    cores = info["cpus"]
    busy = whole.get("machine_busy_s")
    module_cpu = sum(r["own_cpu_s"] + r["child_cpu_s"] for r in modules)
    lines = [
        "# Where the test suite's time goes",
        "",
        f"Written by `bench/suite.py` (its docstring says what is measured). Command: "
        f"`{command}`; code: {info['revision']}; machine: {info['summary']}.",
        "",
        f"- **pytest**: {summary}; the bench's wall time {wall:.0f} s.",
    ]
    if busy is not None:
        share = busy / (cores * whole["wall_s"])
        lines.append(
            f"- **CPU**: the machine was busy {busy:.0f} CPU-seconds over the run's "
            f"{whole['wall_s']:.0f} s, {share:.0%} of its {cores} cores; a run that kept every "
            f"core busy would still take {busy / cores:.0f} s."
        )
    lines += [
        f"- **Modules**: {len(modules)}; their workers' processes used {module_cpu:.0f} "
        "CPU-seconds (the rest ran under dockerd, slurmd or Postgres).",
        "",
        "## Workers",
        "",
        *workers_table(modules, t0),
        "",
        f"## The {min(TOP, len(modules))} longest modules",
        "",
        *modules_table(modules, t0),
        "",
    ]
    return "\n".join(lines)


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The bench's own arguments, and pytest's (those after ``--``)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = split_args(argv)
    ap = argparse.ArgumentParser(
        prog="bench.suite",
        usage="uv run python -m bench.suite [--out PATH] [--durations PATH] [-- PYTEST_ARGS...]",
        description="Run the test suite and write where its time goes.",
        epilog="Arguments after -- go to pytest (pyproject's addopts apply).",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="the Markdown report (default: docs/bench-suite.md)")  # fmt: skip
    ap.add_argument("--durations", type=Path, default=DEFAULT_DURATIONS,
                    help="each module's wall seconds, for tests/schedule.py "
                    "(default: tests/durations.json)")  # fmt: skip
    args = ap.parse_args(ours)
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        profile = Path(tmp) / "profile.jsonl"
        code, summary, wall = run_suite(pytest_args, profile)
        modules, whole = read_profile(profile) if profile.exists() else ([], {})
    if not modules:
        print(f"bench.suite: pytest ran no test (exit {code}); nothing written")
        return code or 1
    command = " ".join(["uv run python -m bench.suite", *argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(modules, whole, summary, wall, command))
    # Merged: a run of some modules updates theirs and keeps the others'.
    durations = json.loads(args.durations.read_text()) if args.durations.exists() else {}
    durations.update({r["module"]: round(r["wall_s"], 1) for r in modules})
    args.durations.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")
    print(f"bench.suite: wrote {args.out} and {args.durations}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
