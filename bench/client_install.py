"""What installing the client costs, against the full install it replaced.

``uv run python -m bench.client_install [--repeats N] [--quick] [--out PATH]`` (default
``docs/bench-client-install.md``)

The wheel of this checkout (`uv build --wheel`) is installed, as `uvx --from leakbisect`
installs it, into a fresh virtual environment with ``uv pip install``, twice over:

- **client**: the wheel alone, the default install (httpx, typer, rich, pydantic, packaging);
- **server and runner**: ``WHEEL[server]`` (the server extra includes the runner's), the same
  set of packages the default install was before the extras existed.

Each install is timed (wall seconds of ``uv pip install``; the venv is made before the clock
starts) **cold**, with a new empty ``UV_CACHE_DIR``, every package fetched from the index uv
is configured with, and **warm**, with the cache that cold install filled (what a second
`uvx` on the same machine pays). The figure is the median of the repeats; the size is the
venv's (``du`` of its files, the interpreter itself is a link) and its distributions.
A cold figure depends on the network as much as on the packages: the report gives the
machine and when it ran. ``--quick`` (tests/test_bench_client_install.py): one repeat of the
client alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from uv import find_uv_bin

from bench.common import machine, write_report

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "bench-client-install.md"
PYTHON = "3.11"
# name -> the requirement installed, given the wheel's path
VARIANTS = {
    "client (`leakbisect`)": "{wheel}",
    "server and runner (`leakbisect[server]`, the default install before)": "{wheel}[server]",
}


@dataclass
class Figures:
    """One variant: install seconds per repeat, cold and warm; the venv's size."""

    cold: list[float]
    warm: list[float]
    size_bytes: int = 0
    distributions: int = 0


def uv_env(cache: Path) -> dict[str, str]:
    """This environment with `cache` as uv's cache and no project venv around it."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_CACHE_DIR")}
    return {**env, "UV_CACHE_DIR": str(cache)}


def install(requirement: str, venv: Path, cache: Path) -> float:
    """Make `venv`, then install `requirement` into it: the install's wall seconds."""
    uv, env = find_uv_bin(), uv_env(cache)
    subprocess.run(
        [uv, "venv", "--quiet", "--python", PYTHON, str(venv)], env=env, check=True, timeout=120
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), requirement],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"uv pip install {requirement}: {proc.stderr[-2000:]}")
    return seconds


def size_of(venv: Path) -> tuple[int, int]:
    """The venv's bytes on disk (hard links to the cache counted: they are its files) and its
    distributions (dist-info folders)."""
    total = 0
    for path in venv.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_blocks * 512
    site = next(venv.glob("lib/python*/site-packages"))
    return total, len(list(site.glob("*.dist-info")))


def measure(wheel: Path, variants: dict[str, str], repeats: int, work: Path) -> dict[str, Figures]:
    """Per variant and repeat: a cold install into a new cache, then a warm one from it; the
    variants alternate, so the network's moods fall on both alike."""
    results = {name: Figures([], []) for name in variants}
    for repeat in range(repeats):
        for i, (name, spec) in enumerate(variants.items()):
            requirement = spec.format(wheel=wheel)
            run = work / f"{i}-{repeat}"
            cache = run / "cache"
            results[name].cold.append(install(requirement, run / "cold", cache))
            results[name].warm.append(install(requirement, run / "warm", cache))
            results[name].size_bytes, results[name].distributions = size_of(run / "warm")
            shutil.rmtree(run, ignore_errors=True)
    return results


def build_wheel(out: Path) -> Path:
    subprocess.run(
        [find_uv_bin(), "build", "--quiet", "--wheel", "--out-dir", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    return next(out.glob("leakbisect-*.whl"))


def report(results: dict[str, Figures], repeats: int, command: str) -> str:
    host = machine()
    rows = [
        "| install | cold, s | warm, s | venv size, MiB | distributions |",
        "|---|---|---|---|---|",
    ]
    for name, f in results.items():
        rows.append(
            f"| {name} | {statistics.median(f.cold):.1f} | {statistics.median(f.warm):.2f} | "
            f"{f.size_bytes / 2**20:.0f} | {f.distributions} |"
        )
    return "\n".join(
        [
            "# Client install",
            "",
            "Written by `bench/client_install.py` (its docstring says what is measured): "
            f"`uv pip install` of this checkout's wheel into a new Python {PYTHON} venv, cold "
            "(an empty uv cache: every package from the index uv is configured with) and warm "
            f"(the cache the cold install filled). Median of {repeats} repeat(s), seconds.",
            "",
            f"- Command: `{command}`",
            f"- Code: {host['revision']}",
            f"- Machine: {host['summary']}; {host['uv']}",
            f"- When: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (a cold figure is "
            "mostly the network's: compare the rows of one run, not runs); load average "
            f"(1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
            "",
            *rows,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="installs per variant (3)")
    parser.add_argument("--quick", action="store_true", help="one repeat, the client only")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown report")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    variants = dict(list(VARIANTS.items())[:1]) if args.quick else VARIANTS
    repeats = 1 if args.quick else args.repeats
    command = "uv run python -m bench.client_install " + " ".join(argv or sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="leakbisect-bench-install-") as tmp:
        wheel = build_wheel(Path(tmp) / "wheel")
        results = measure(wheel, variants, repeats, Path(tmp))
    print(write_report(args.out, report(results, repeats, command.strip())))


if __name__ == "__main__":
    main()
