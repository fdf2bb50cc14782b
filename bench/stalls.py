"""Verdicts when the runner stalls: real runs of the shapes, replayed with what a loaded
machine does to the sampler.

``uv run python -m bench.stalls [--shapes a,b] [--sizes 0.1,0.2,0.3,0.5] [--every 0.02]
[--out docs/bench-stalls.md]``

Each shape of `service.example.shapes` (real scripts: numpy and scipy imported, threads,
allocators) runs once under the real sampler and memory cap, as tests/test_shapes.py runs it.
Its samples and step markers are then judged again (`engine.analysis.classify_run`, as the
service judges a trial) with one stretch of ``size`` seconds taken out, at every ``every``
seconds from the first marker to the last, three ways:

- **gap**: the sampler took no sample (its thread descheduled);
- **lag**: the step markers of the stretch were read only at its end (the reader thread
  descheduled), the samples kept;
- **stall**: both (the whole runner descheduled).

On a 2-core machine under the test suite the sampler's intervals fall into two groups,
about 20 ms and 100 to 220 ms (last stop's note), so a stretch of 0.1 to 0.5 s covers what
was seen. A bounded shape must never come out a leak, and a leak should stay a leak. The
report counts each replay's verdict per shape; the figures are the rule's, not the
machine's, once the run is recorded (``--seed`` does not apply: the runs are real).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.common import machine, write_report
from engine.analysis import classify_run
from runners.executor import run_script
from service.example.shapes import MEMORY_LIMIT, SHAPES

KINDS = ("gap", "lag", "stall")
VERDICTS = ("leak", "plateau", "clean", "inconclusive")


def record(name: str, work: Path) -> tuple[np.ndarray, np.ndarray, list[tuple[float, int]]]:
    """One real run of shape `name`: sample times, RSS, step markers."""
    work.mkdir(parents=True, exist_ok=True)
    ex = run_script(sys.executable, SHAPES[name].script, cwd=work, timeout_s=300,
                    memory_limit_bytes=MEMORY_LIMIT, run_as=None)  # fmt: skip
    if ex.exit_code != 0:
        raise RuntimeError(f"shape {name} exited {ex.exit_code}: {ex.log_tail[-400:]}")
    t = np.array([s.t for s in ex.samples])
    return t, np.array([s.rss for s in ex.samples], dtype=float), list(ex.steps)


def verdict(t: np.ndarray, rss: np.ndarray, steps: list[tuple[float, int]]) -> str:
    run = classify_run(list(t), list(rss), None, steps, exit_code=0, oom_killed=False,
                       timed_out=False)  # fmt: skip
    return run.verdict.value


def replays(
    t: np.ndarray, rss: np.ndarray, steps: list[tuple[float, int]], sizes: list[float],
    every: float,
) -> Iterator[tuple[str, float, str]]:  # fmt: skip
    """(kind, size, verdict) of every replay of one recorded run."""
    first, last = steps[0][0], steps[-1][0]
    for size in sizes:
        for at in np.arange(first, last, every):
            out = (t >= at) & (t < at + size)
            late = [(at + size if at <= mt < at + size else mt, s) for mt, s in steps]
            yield "gap", size, verdict(t[~out], rss[~out], steps)
            yield "lag", size, verdict(t, rss, late)
            yield "stall", size, verdict(t[~out], rss[~out], late)


def measure(names: list[str], sizes: list[float], every: float) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-stalls-") as tmp:
        for name in names:
            t, rss, steps = record(name, Path(tmp) / name)
            counts: Counter[tuple[str, str]] = Counter()
            for kind, _, v in replays(t, rss, steps, sizes, every):
                counts[kind, v] += 1
            rows.append({"shape": name, "truth": SHAPES[name].truth,
                         "as_run": verdict(t, rss, steps), "counts": counts})  # fmt: skip
            print(f"stalls: {name}: {verdict(t, rss, steps)}, {dict(counts)}", file=sys.stderr)
    return rows


def render(rows: list[dict], sizes: list[float], every: float, command: str) -> str:
    head = "| shape | truth | as run | " + " | ".join(f"{k}: {v}" for k in KINDS for v in
                                                       VERDICTS) + " |"  # fmt: skip
    lines = [
        "# Verdicts when the runner stalls", "",
        "Real runs of `service.example.shapes`, each replayed with one stretch of "
        f"{', '.join(f'{s:g}' for s in sizes)} s taken out at every {every:g} s between the "
        "first and last step markers (`bench/stalls.py` says how). Counts of replays per "
        "verdict; a bounded shape's leak count must be 0.", "",
        head, "|" + " --- |" * (3 + len(KINDS) * len(VERDICTS)),
    ]  # fmt: skip
    for r in rows:
        cells = [str(r["counts"][k, v]) for k in KINDS for v in VERDICTS]
        lines.append(f"| {r['shape']} | {r['truth']} | {r['as_run']} | " + " | ".join(cells)
                     + " |")  # fmt: skip
    bounded = sum(r["counts"][k, "leak"] for r in rows if r["truth"] == "bounded" for k in KINDS)
    lines += ["", f"Leak verdicts on bounded shapes: {bounded}.", "",
              f"Machine: {machine()['summary']}", "", f"Command: `{command}`", ""]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stalls", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help="comma-separated shapes (default: all)")  # fmt: skip
    ap.add_argument("--sizes", default="0.1,0.2,0.3,0.5", help="stretch lengths, seconds")
    ap.add_argument("--every", type=float, default=0.02, help="offset step, seconds")
    ap.add_argument("--out", type=Path, default=Path("docs/bench-stalls.md"))
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    try:
        sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes: not a list of seconds: {args.sizes!r}")
    if not sizes or min(sizes) <= 0 or args.every <= 0:
        ap.error("--sizes and --every must be positive seconds")
    rows = measure(names, sizes, args.every)
    command = "uv run python -m bench.stalls " + " ".join(argv if argv is not None else
                                                          sys.argv[1:])  # fmt: skip
    print(write_report(args.out, render(rows, sizes, args.every, command.strip())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
