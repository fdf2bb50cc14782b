"""`python -m service.example WHAT DEST`: write the offline examples the README's worked
examples bisect, or serve a directory of their wheels as a package index.

    python -m service.example fixture DEST [--native]   leakyfixture's releases (1.0.6 leaks)
    python -m service.example suite DEST SCENARIO       good.txt, bad.txt, repro.py and wheels
    python -m service.example gitrepo DEST              leakyfixture's git history, v1.0.5..v1.0.6
    python -m service.example serve DIR [--port N]      DIR's wheels at http://127.0.0.1:N/simple
    python -m service.example serve-git REPO [--port N] REPO over http (git's dumb protocol)
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

from service.example.fixture import FixtureSpec, build_fixture
from service.example.gitrepo import build_repo, serve_repo
from service.example.index import serve_index
from service.example.suite import SCENARIOS, build_suite


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m service.example", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="what", required=True)
    fixture = sub.add_parser("fixture", help="leakyfixture's releases, 1.0.6 the first leaking")
    fixture.add_argument("dest", type=Path)
    fixture.add_argument("--native", action="store_true",
                         help="leak through malloc in C (needs cc), not a bytearray")  # fmt: skip
    suite = sub.add_parser("suite", help="an environment pair for --from/--to")
    suite.add_argument("dest", type=Path)
    suite.add_argument("scenario", choices=SCENARIOS)
    repo = sub.add_parser("gitrepo", help="a local clone for --commits --repo")
    repo.add_argument("dest", type=Path)
    serve = sub.add_parser("serve", help="serve a directory of wheels until interrupted")
    serve.add_argument("dir", type=Path)
    serve.add_argument("--port", type=int, default=0, help="0 (default): any free port")
    serve_git = sub.add_parser("serve-git", help="serve a git repository until interrupted")
    serve_git.add_argument("repo", type=Path)
    serve_git.add_argument("--port", type=int, default=0, help="0 (default): any free port")
    args = ap.parse_args(argv)
    if args.what == "fixture":
        build_fixture(args.dest, FixtureSpec(leak_via="native" if args.native else "python"))
        print(args.dest)
    elif args.what == "suite":
        made = build_suite(args.dest, args.scenario)
        print(f"{made.good} {made.bad} {made.repro}; culprits: {', '.join(made.culprits)}")
    elif args.what == "gitrepo":
        made = build_repo(args.dest)
        print(f"{made.path}: {len(made.commits)} commits {made.old_tag}..{made.new_tag}, "
              f"the leak in {made.leaking_sha[:12]}")  # fmt: skip
    elif args.what == "serve-git":
        _until_interrupted(serve_repo(args.repo, port=args.port))
    else:
        _until_interrupted(serve_index(args.dir, port=args.port))
    return 0


def _until_interrupted(serving: AbstractContextManager[str]) -> None:
    # Ctrl-C ends it also when it was started with SIGINT ignored (a background job of a
    # non-interactive shell, as CI starts it): Python keeps an inherited SIG_IGN.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with serving as url:
        print(url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    sys.exit(main())
