"""What every measurement shares: the run's configuration, the machine, tables, timing."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from runners.machine import describe_machine

MIB = 1024 * 1024


@dataclass(frozen=True)
class Config:
    """One benchmark run. `quick` shrinks every corpus and duration to CI size."""

    quick: bool
    out: Path
    command: str
    seed: int = 20240607
    workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))
    # What one section of a quick run measured that a later one would measure again, the
    # same way (the naive loop over the bundled fixture: sections 5 and 6), by name.
    measured: dict[str, Any] = field(default_factory=dict)

    def pick(self, full: Any, quick: Any) -> Any:
        """`full` in a full run, `quick` in a quick one."""
        return quick if self.quick else full


def run_section(
    measure: Callable[[Config], dict[str, Any]], cfg: Config, info: dict[str, Any]
) -> dict[str, Any]:
    """A section's results from `measure(cfg)`, stamped with the machine (`info`), the
    command, when, how long it took and the load average before and after, as the report
    shows them under its tables."""
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    sec = measure(cfg)
    sec.update(
        machine=info,
        command=cfg.command,
        when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        elapsed_s=time.monotonic() - t0,
        load=[load0, os.getloadavg()[0]],
    )
    return sec


def write_report(path: Path, text: str) -> str:
    """Write a standalone benchmark's Markdown report (bench/claims.py, bench/api_load.py),
    making its folder; the text, for the caller to print."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def table(caption: str, headers: list[str], rows: list[list[Any]], note: str = "") -> dict:
    """A table as the report renders it: every cell already formatted as text."""
    return {
        "caption": caption,
        "headers": list(headers),
        "rows": [[str(c) for c in row] for row in rows],
        "note": note,
    }


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def machine() -> dict[str, Any]:
    """The machine the numbers come from; printed under every table."""
    info = describe_machine()
    info["distribution"] = _os_name()
    info["uv"] = uv_version()
    info["revision"] = code_revision()
    gib = info["memory_bytes"] / 1024**3
    gpu = info.get("gpu")
    info["summary"] = (
        f"{info['cpu']}, {info['cpus']} cores, {gib:.1f} GiB RAM, Python {info['python']}, "
        f"{info['os']} ({info['distribution']})" + (f", GPU {gpu}" if gpu else "")
    )
    return info


def code_revision() -> str:
    """The commit the numbers come from, and whether measured code had local changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "service", "runners"],
            cwd=root, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except OSError:
        return "unknown"
    if not head:
        return "unknown"
    return f"commit {head}" + (" with uncommitted changes in service/ or runners/" if dirty else "")


def uv_version() -> str:
    try:
        from uv import find_uv_bin

        uv = find_uv_bin()
    except (ImportError, FileNotFoundError):
        uv = shutil.which("uv") or "uv"
    try:
        out = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@contextmanager
def reachable_tmpdir(prefix: str) -> Iterator[str]:
    """A temporary directory (removed after) that every user can enter (0755).

    When the benchmarks run as root, environments are built as the build user and
    scripts run as the trial user (runners.users); `tempfile`'s 0700 directories would
    shut both out of the environment roots and uv caches made inside them.
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.chmod(tmp, 0o755)
        yield tmp


@contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    """`with stopwatch() as w: ...` then `w["s"]` holds the wall seconds."""
    box = {"s": 0.0}
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box["s"] = time.perf_counter() - t0


def pct(x: float) -> str:
    return f"{100.0 * x:.1f}"


def secs(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def ratio(a: float, b: float) -> str:
    """How many times `a` is `b`, as text ("3.2x")."""
    if b <= 0:
        return "n/a"
    return f"{a / b:.1f}x"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without settings that would change what a tool does.

    pip and uv configuration from the machine (extra indexes, find-links, a config
    file) would let a build pick wheels from somewhere else than the index under
    test, so both are told to use exactly the index they are given.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "UV_", "BISECT_")) and k not in ("VIRTUAL_ENV",)
    }
    # Certificates are how to reach an index, not what to install: keep them.
    for key in ("PIP_CERT",):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        UV_NO_CONFIG="1",
    )
    env.update(extra)
    return env


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of one process, 0 when it is gone."""
    try:
        t = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0.0
    return float(t.user + t.system)
