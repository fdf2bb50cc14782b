"""`python -m service.example.realistic DEST`: write both packages' wheels under DEST/NAME
and print the `bisect-cli run` that bisects each (with --find-links beside uv's index)."""

import sys
from pathlib import Path

from service.example.realistic import REPROS, SPECS, build_realistic


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m service.example.realistic DEST", file=sys.stderr)
        return 2
    for name, spec in SPECS.items():
        wheels = build_realistic(Path(argv[0]) / name, spec)
        print(f"bisect-cli run {REPROS[name]} --package {name} --range {spec.span()} "
              f"--find-links {wheels}   # first bad {spec.first_leaking}")  # fmt: skip
    return 0


sys.exit(main(sys.argv[1:]))
