"""CLI start-up cost: what `bisect-cli` spends before (and while) a command runs.

``uv run python -m bench.cli_startup [--repeats N] [--label TEXT] [--root DIR]
[--out docs/bench-cli-startup.md]``

Each figure is over N fresh processes after one warm-up: the median and p90 of the
process's CPU time (user + system, from ``getrusage(RUSAGE_CHILDREN)``) and of its wall time.

- ``bisect-cli --help``;
- ``bisect-cli run --help``;
- ``import service.cli.run`` in a fresh interpreter: the `run` command's module and what it
  imports at the top (what `run` imports when it is called is in the next figure);
- ``bisect-cli run`` to its first failure: a one-line script, ``--index-url`` a closed
  port on 127.0.0.1, into a SQLite database that is already at the newest schema. It parses
  the options, opens (and checks the schema of) the database, prepares the executor, and
  fails listing the releases (exit 2): every import and start-up step of a real local run,
  none of its trials.

Under the table: the top-level packages each command imported (``-X importtime``; the
standard library left out), so a heavy one that crept in shows by name.

``--root DIR`` measures the checkout in DIR (its ``.venv``) instead of this one, so an
older commit is measured with this file; ``--against DIR`` measures a second checkout too,
its runs alternating with the first's, which is how to compare two on a shared machine:
``git worktree add /tmp/base REV && (cd /tmp/base && uv sync) && uv run python -m
bench.cli_startup --against /tmp/base --against-label before --label after``.
Sections are kept per label (re-running a label replaces its section); each gives the load
average when it was written.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "bench-cli-startup.md"
SCRIPT = 'print("hello")\n'


def _p90(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} (p90 {_p90(values) * 1000:.0f})"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cwd(argv: list[str]) -> Path:
    """The checkout of the interpreter in `argv`: its code, not this one's, is imported."""
    return Path(argv[0]).parents[2]


def _once(argv: list[str], env: dict[str, str], ok: set[int]) -> tuple[float, float]:
    """One process: (CPU seconds, wall seconds); an unexpected exit status is an error."""
    cpu0, t0 = _children_cpu(), time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=_cwd(argv))
    wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    if proc.returncode not in ok:
        raise RuntimeError(f"{argv}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return cpu, wall


def _top_level(argv: list[str], env: dict[str, str], ok: set[int]) -> list[str]:
    """The non-stdlib top-level packages the command imported (``-X importtime``)."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        env=env,
        capture_output=True,
        text=True,
        cwd=_cwd(argv),
    )
    if proc.returncode not in ok:
        raise RuntimeError(f"{argv}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    names = set()
    for line in proc.stderr.splitlines():
        found = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", line)
        if found:
            top = found.group(1).split(".")[0]
            if top not in sys.stdlib_module_names and not top.startswith("_"):
                names.add(top)
    return sorted(names)


def commands(root: Path, work: Path) -> dict[str, tuple[list[str], set[int]]]:
    """Each figure's argv (run with the checkout's interpreter) and its expected exits."""
    python = str(root / ".venv" / "bin" / "python")
    cli = [python, "-m", "service.cli"]
    work.mkdir()
    script = work / "repro.py"
    script.write_text(SCRIPT)
    database = f"sqlite:///{work / 'results.db'}"
    run = [
        *cli, "run", str(script), "-p", "leakyfixture", "--range", "1.0.0..1.0.1",
        "--index-url", "http://127.0.0.1:9/simple", "--database-url", database, "--json",
    ]  # fmt: skip
    return {
        "bisect-cli --help": ([*cli, "--help"], {0}),
        "bisect-cli run --help": ([*cli, "run", "--help"], {0}),
        "import service.cli.run": ([python, "-c", "import service.cli.run"], {0}),
        "bisect-cli run, to its first failure": (run, {2}),
    }


def measure(
    roots: list[Path], repeats: int
) -> list[tuple[dict[str, tuple[str, str]], dict[str, list[str]]]]:
    """Each checkout's figures and imports; with several, their runs alternate (one of each
    per repeat), so load on the shared machine falls on all of them alike."""
    env = {**os.environ, "COLUMNS": "100"}
    env.pop("BISECT_DATABASE_URL", None)
    results: list[tuple[dict[str, tuple[str, str]], dict[str, list[str]]]] = [
        ({}, {}) for _ in roots
    ]
    with tempfile.TemporaryDirectory(prefix="leakbisect-bench-cli-") as tmp:
        env["BISECT_DATA_DIR"] = str(Path(tmp) / "data")
        per_root = [commands(root, Path(tmp) / str(i)) for i, root in enumerate(roots)]
        for name in per_root[0]:
            runs = [cmds[name] for cmds in per_root]
            for argv, ok in runs:
                _once(argv, env, ok)  # warm-up (and, for run, the database at the newest schema)
            cpus: list[list[float]] = [[] for _ in roots]
            walls: list[list[float]] = [[] for _ in roots]
            for _ in range(repeats):
                for i, (argv, ok) in enumerate(runs):
                    cpu, wall = _once(argv, env, ok)
                    cpus[i].append(cpu)
                    walls[i].append(wall)
            for i, (argv, ok) in enumerate(runs):
                results[i][0][name] = (_ms(cpus[i]), _ms(walls[i]))
                results[i][1][name] = _top_level(argv, env, ok)
    return results


def _revision(root: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "service", "runners", "contract", "engine")
    return f"commit {head}" + (" with uncommitted changes" if dirty else "") if head else "unknown"


def render(
    previous: str,
    label: str,
    rows: dict[str, tuple[str, str]],
    imported: dict[str, list[str]],
    command: str,
    revision: str,
) -> str:
    header = (
        "# CLI start-up time\n\n"
        "Written by `bench/cli_startup.py` (see its docstring for what is measured). Each "
        "figure: median over the repeats, p90 in brackets, milliseconds; CPU is user + system "
        "time of the process.\n"
    )
    sections = re.split(r"(?m)^## ", previous)[1:] if previous else []
    kept = [s for s in sections if not s.startswith(label + "\n")]
    info = machine()
    body = [f"{label}\n", f"- Command: `{command}`", f"- Code: {revision}",
            f"- Load average (1 min) when the run ended: {os.getloadavg()[0]:.2f} on "
            f"{os.cpu_count()} cores", f"- Machine: {info['summary']}", "",
            "| command | CPU, ms | wall, ms |", "|---|---|---|"]  # fmt: skip
    body += [f"| `{k}` | {cpu} | {wall} |" for k, (cpu, wall) in rows.items()]
    body += ["", "Top-level packages imported (standard library left out):", ""]
    body += [f"- `{k}`: {', '.join(v)}" for k, v in imported.items()]
    kept.append("\n".join(body) + "\n\n")
    return header + "\n" + "".join("## " + s for s in kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cli_startup", description=__doc__)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--label", default="current code")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure")
    ap.add_argument(
        "--against",
        type=Path,
        help="also measure this checkout, its runs alternating with --root's (a section of "
        "its own, labelled --against-label)",
    )
    ap.add_argument("--against-label", default="baseline")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    measured = [(args.root.resolve(), args.label)]
    if args.against is not None:
        measured.insert(0, (args.against.resolve(), args.against_label))
    results = measure([root for root, _ in measured], args.repeats)
    command = f"uv run python -m bench.cli_startup --repeats {args.repeats}"
    if args.root.resolve() != ROOT:
        command += f" --root {args.root}"
    command += f" --label '{args.label}'"
    if args.against is not None:
        command += f" --against {args.against} --against-label '{args.against_label}'"
    text = args.out.read_text() if args.out.exists() else ""
    for (root, label), (rows, imported) in zip(measured, results, strict=True):
        text = render(text, label, rows, imported, command, _revision(root))
        for k, (cpu, wall) in rows.items():
            print(f"{label}: {k}: CPU {cpu} ms, wall {wall} ms")
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
