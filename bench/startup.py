"""Trial start-up cost: what the sandbox (supervisor, uid drop, allowlisted env) adds.

``uv run python -m bench.startup [--repeats N] [--label TEXT] [--out docs/bench-startup.md]``

Two figures, each over N runs after one warm-up run:

- **run_script to first line**: from the `runners.executor.run_script` call to the instant
  the script printed its first line (the script prints `time.monotonic()`, a clock all
  processes share on Linux), and the whole `run_script` call for that one-line script;
- **execute_trial, reused env**: the whole `runners.trial.execute_trial` of the same
  trivial script in an environment that is already built (so: the reuse check, a stat
  fingerprint of the environment's files (`runners.publish`; before issue 24 it ran `uv pip
  freeze`), leasing a trial user, the working directory, the script and the clean-up).

The environment is the fixture's ``leakyfixture==1.0.2`` from the offline index
(127.0.0.1), built with ``/usr/bin/python3.11`` so the measured interpreter is the same
before and after the sandbox (the runner's own pyenv interpreter under /root cannot be run
by another uid). The work directory is made under /tmp with mode 0755 so that the
build and trial users can reach it when the benchmark runs as root.

Results are appended to the report as one section per ``--label`` (re-running with the
same label replaces that section), so "before" and "after" sit side by side. To measure
an older commit, extract it and run this file from there, writing into this report:
``git archive REV | tar -x -C DIR; cp bench/startup.py DIR/bench/; cd DIR &&
python -m bench.startup --label before --out <repo>/docs/bench-startup.md``. The machine
is shared: each section gives the load average when it started; compare sections measured
back to back.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import code_revision, machine
from contract.wire import EnvSpec, TrialSpec
from runners.executor import run_script
from runners.trial import execute_trial
from service.example.fixture import build_fixture
from service.example.index import serve_index

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "bench-startup.md"
PYTHON = "/usr/bin/python3.11"
SCRIPT = "import time\nprint(repr(time.monotonic()), flush=True)\n"


def _ms(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
    return f"{statistics.median(values) * 1000:.1f} (p90 {p90 * 1000:.1f})"


def _first_line_time(log_tail: str) -> float:
    match = re.search(r"^([0-9]+\.[0-9]+)$", log_tail, re.M)
    if match is None:
        raise RuntimeError(f"the script printed no time: {log_tail!r}")
    return float(match.group(1))


def _run_script_once(python: str, work: Path) -> tuple[float, float]:
    script = work / "first_line.py"
    script.write_text(SCRIPT)
    kwargs = {}
    if "run_as" in inspect.signature(run_script).parameters:
        kwargs["run_as"] = None  # the script lives in a root-owned scratch dir
    t0 = time.monotonic()
    ex = run_script(python, script, cwd=work, timeout_s=60, memory_limit_bytes=256 << 20, **kwargs)
    total = time.monotonic() - t0
    if ex.exit_code != 0:
        raise RuntimeError(f"run_script failed: exit {ex.exit_code}: {ex.log_tail}")
    return _first_line_time(ex.log_tail) - t0, total


def _execute_trial_once(spec: TrialSpec, env_root: Path, cache: Path) -> float:
    t0 = time.monotonic()
    report = execute_trial(spec, env_root=env_root, cache_dir=cache)
    took = time.monotonic() - t0
    if report.exit_code != 0 or not report.env.reused:
        raise RuntimeError(f"execute_trial failed: {report.env.error or report.log_tail}")
    return took


def measure(repeats: int, work: Path, index_url: str) -> dict[str, str]:
    env_root, cache = work / "envs", work / "uv-cache"
    spec = TrialSpec(
        trial_id=1,
        env=EnvSpec(package="leakyfixture", version="1.0.2", python=PYTHON, index_url=index_url),
        script=SCRIPT,
        timeout_s=60,
        memory_limit_bytes=256 << 20,
    )
    first = execute_trial(spec, env_root=env_root, cache_dir=cache)  # builds the env
    if not first.env.ok or first.env.python_executable is None:
        raise RuntimeError(f"environment build failed: {first.env.error}")
    python = first.env.python_executable
    scratch = work / "scratch"
    scratch.mkdir(mode=0o755)
    _run_script_once(python, scratch)  # warm-up
    firsts, totals = [], []
    for _ in range(repeats):
        f, t = _run_script_once(python, scratch)
        firsts.append(f)
        totals.append(t)
    _execute_trial_once(spec, env_root, cache)  # warm-up
    trials = [_execute_trial_once(spec, env_root, cache) for _ in range(repeats)]
    return {
        "run_script call to the script's first line, ms": _ms(firsts),
        "whole run_script of a one-line script, ms": _ms(totals),
        "whole execute_trial, reused env, ms": _ms(trials),
    }


def render(previous: str, label: str, rows: dict[str, str], command: str) -> str:
    header = (
        "# Trial start-up time\n\n"
        "Written by `bench/startup.py` (see its docstring for what is measured). "
        "Each figure: median over the repeats, p90 in brackets, milliseconds. An older commit "
        "is measured by running this file from an extracted copy of it (see the docstring).\n"
    )
    sections = re.split(r"(?m)^## ", previous)[1:] if previous else []
    kept = [s for s in sections if not s.startswith(label + "\n")]
    info = machine()
    load = os.getloadavg()[0]
    body = [f"{label}\n", f"- Command: `{command}`", f"- Code: {code_revision()}",
            f"- Load average (1 min) when the run ended: {load:.2f} on {os.cpu_count()} cores",
            f"- Machine: {info['summary']}", f"- Running as uid {os.getuid()}", "",
            "| figure | ms |", "|---|---|"]  # fmt: skip
    body += [f"| {k} | {v} |" for k, v in rows.items()]
    kept.append("\n".join(body) + "\n\n")
    return header + "\n" + "".join("## " + s for s in kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--label", default="current code")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="leakbisect-bench-startup-"))
    work.chmod(0o755)
    try:
        wheels = work / "wheels"
        wheels.mkdir()
        build_fixture(wheels)
        with serve_index(wheels) as url:
            rows = measure(args.repeats, work, url)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = f"uv run python -m bench.startup --repeats {args.repeats} --label '{args.label}'"
    previous = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(render(previous, args.label, rows, command))
    for k, v in rows.items():
        print(f"{k}: {v}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
