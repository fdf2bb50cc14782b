"""Per-trial cost of the Docker executor against the subprocess executor.

``uv run python -m bench.docker [--repeats N] [--out docs/bench-docker.md]``

Each figure is the median over N runs after one warm-up (p90 in brackets), seconds:

- **whole trial, reused env**: ``run_trial`` of a one-line script whose environment is
  already built (``leakyfixture==1.0.2`` from the offline fixture index on 127.0.0.1),
  with the local executor and with the Docker executor (build container: the reuse
  check; run container: create, copy the script in, start, sample, stop, remove);
- **the script itself**: the trial's ``duration_s`` (start to exit), so the difference is
  what each executor adds around it;
- **bare container lifecycle**: create + start + wait + remove of ``true`` in the runner
  image with ``network_mode="none"``: the engine's share of the overhead.

Also the sizes of the base, runner and API images. Needs the engine and the images
(``dockerfiles/build-base.sh && uv run python -m runners.docker.images``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import code_revision, machine
from contract.wire import EnvSpec, TrialReport, TrialSpec
from runners.docker.executor import DockerExecutor
from runners.docker.images import API_IMAGE, BASE_IMAGE, RUNNER_IMAGE
from runners.trial import LocalExecutor
from service.example.fixture import build_fixture
from service.example.index import serve_index

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "bench-docker.md"
SCRIPT = "print('hello')\n"


def _s(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
    return f"{statistics.median(values):.2f} (p90 {p90:.2f})"


def _trials(run: Callable[[], TrialReport], repeats: int) -> tuple[list[float], list[float]]:
    run()  # builds the environment, or warms the reuse path
    totals, scripts = [], []
    for _ in range(repeats):
        t0 = time.monotonic()
        report = run()
        totals.append(time.monotonic() - t0)
        if report.exit_code != 0 or not report.env.reused:
            raise RuntimeError(f"trial failed: {report.env.error or report.log_tail}")
        scripts.append(report.duration_s)
    return totals, scripts


def _lifecycle(client: Any, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats + 1):
        t0 = time.monotonic()
        c = client.containers.create(RUNNER_IMAGE, ["true"], network_mode="none")
        c.start()
        c.wait()
        c.remove(force=True)
        out.append(time.monotonic() - t0)
    return out[1:]


def measure(repeats: int, work: Path, index_url: str) -> dict[str, str]:
    spec = TrialSpec(
        trial_id=1, env=EnvSpec(package="leakyfixture", version="1.0.2", index_url=index_url),
        script=SCRIPT, timeout_s=60, memory_limit_bytes=256 << 20,
    )  # fmt: skip
    local = LocalExecutor(work / "envs", work / "uv-cache")
    docker_ex = DockerExecutor.from_env(runner_name=f"bench-{os.getpid()}",
                                        cache_volume="leakbisect-bench-cache")  # fmt: skip
    lt, ls = _trials(lambda: local.run_trial(spec), repeats)
    dt, ds = _trials(lambda: docker_ex.run_trial(spec), repeats)
    overhead = [d - x for d, x in zip(sorted(dt), sorted(lt), strict=True)]
    rows = {
        "local: whole trial, reused env": _s(lt),
        "local: the script itself": _s(ls),
        "docker: whole trial, reused env": _s(dt),
        "docker: the script itself": _s(ds),
        "docker minus local, per trial": _s(overhead),
        "bare container lifecycle (create, start, wait, remove)": _s(
            _lifecycle(docker_ex.client, repeats)
        ),
    }
    for tag in (BASE_IMAGE, RUNNER_IMAGE, API_IMAGE):
        size = docker_ex.client.images.get(tag).attrs["Size"] / 1e6
        rows[f"image {tag}, MB"] = f"{size:.0f}"
    return rows


def render(
    rows: dict[str, str],
    command: str,
    repeats: int,
    *,
    title: str = "Docker executor: per-trial overhead",
    script: str = "bench/docker.py",
    notes: tuple[str, ...] = (),
) -> str:
    """The report of a per-trial benchmark (this one's, and bench/executors.py's)."""
    info = machine()
    lines = [
        f"# {title}",
        "",
        f"Written by `{script}` (its docstring says what is measured). Seconds, median "
        f"over {repeats} runs (p90 in brackets), after one warm-up run each.",
        "",
        f"- Command: `{command}`",
        f"- Code: {code_revision()}",
        f"- Load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
        " (a shared machine: compare figures from one run)",
        f"- Machine: {info['summary']}",
        *(f"- {note}" for note in notes),
        "",
        "| figure | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows.items()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.docker", description=__doc__)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="leakbisect-bench-docker-"))
    work.chmod(0o755)  # the sandbox users must reach the local executor's environments
    wheels = build_fixture(work / "wheels")
    with serve_index(wheels) as url:
        rows = measure(args.repeats, work, url)
    command = "uv run python -m bench.docker" + (f" --repeats {args.repeats}")
    args.out.write_text(render(rows, command, args.repeats))
    for k, v in rows.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
