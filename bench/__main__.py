"""`python -m bench [--quick --out DIR] [--only a,b]`: run the benchmarks, write the report."""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import time
from pathlib import Path

from bench.common import Config, machine, run_section
from bench.report import SECTIONS, write

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="CI-sized: small corpus, few ranges, fixture only, short runs",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for benchmarks.md and bench/*.png (default docs/; "
        "required with --quick so a quick run never overwrites the docs)",
    )
    ap.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of {','.join(SECTIONS)}; merged into the "
        "results already in OUT/bench/results.json",
    )
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: rewrite benchmarks.md and the plots from OUT/bench/results.json",
    )
    args = ap.parse_args(argv)  # fmt: skip
    if args.quick and args.out is None:
        ap.error("--quick needs --out DIR (a quick run must not overwrite docs/)")
    out = args.out or DEFAULT_OUT
    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = set(only) - set(SECTIONS)
    if unknown:
        ap.error(f"--only: unknown {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")

    if args.render:
        previous = out / "bench" / "results.json"
        if not previous.exists():
            ap.error(f"--render: no {previous}; run the benchmarks first")
        md = write(json.loads(previous.read_text()), out)
        print(f"rewrote {md} from {previous}", file=sys.stderr)
        return 0

    command = shlex.join(["uv", "run", "python", "-m", "bench", *argv])
    cfg = Config(quick=args.quick, out=out, command=command, seed=args.seed)
    results: dict = {}
    previous = out / "bench" / "results.json"
    if args.only and previous.exists():
        results = json.loads(previous.read_text())
    info = machine()
    started = time.monotonic()
    for key in only:
        module = importlib.import_module(f"bench.{key}")
        cfg.log(f"== {key}")
        results[key] = run_section(module.run, cfg, info)
    ordered = {k: results[k] for k in SECTIONS if k in results}
    md = write(ordered, out)
    cfg.log(f"wrote {md} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
