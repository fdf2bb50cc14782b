"""Wall time of the end-to-end fixture bisection through the service, with 1 and 2 runners.

    uv run python bench/service_e2e.py [--runners 1,2] [--repeat 1] [--report docs/bench-service.md]

For each runner count: a fresh home (database, environments) and the shared uv
cache; `bisect-cli serve --runners 0` on a free port (SQLite), N `bisect-cli
runner` processes, and, once every runner has registered, the timed command
`bisect-cli submit service/example/repro.py --package leakyfixture --range
1.0.0..1.0.9 --index-url <fixture index> --wait --json`. Reported per run: the
wall time of that command (what a CI step waits: interpreter start, submission
with the server's release listing and pin resolution, the bisection, the
report), the job's own time on the server (created -> finished), the number of
trials and the answer. A warm-up run first fills the uv cache and is not counted,
so every measured run builds environments from a warm cache, as a long-lived
runner does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import reachable_tmpdir  # noqa: E402
from runners.client import ApiClient  # noqa: E402
from service.example.fixture import build_fixture  # noqa: E402
from service.example.index import serve_index  # noqa: E402

CLI = [sys.executable, "-m", "service.cli"]
REPRO = REPO / "service" / "example" / "repro.py"


def _env(home: Path, uv_cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BISECT_")}
    env.update(
        XDG_DATA_HOME=str(home / "data"),
        XDG_CACHE_HOME=str(home / "cache"),
        UV_CACHE_DIR=str(uv_cache),
    )
    return env


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise RuntimeError("serve printed nothing")
    return proc.stdout.readline()


def _say(t0: float, what: str) -> None:
    print(f"  [{time.monotonic() - t0:6.1f}s] {what}", file=sys.stderr, flush=True)


def one_run(runners: int, index: str, uv_cache: Path) -> dict[str, Any]:
    start = time.monotonic()
    with reachable_tmpdir(prefix="leakbisect-bench-") as tmp:
        home = Path(tmp)
        env = _env(home, uv_cache)
        procs: list[subprocess.Popen] = []
        with (home / "serve.log").open("w") as err:
            serve = subprocess.Popen(
                CLI + ["serve", "--port", "0", "--runners", "0", "--json"]
                + ["--database-url", f"sqlite:///{home / 'bench.db'}"],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env,
            )  # fmt: skip
        try:
            line = _read_line(serve, 60)
            if not line:
                raise RuntimeError((home / "serve.log").read_text())
            url = json.loads(line)["url"]
            _say(start, f"serve listening on {url}")
            logs = []
            for i in range(runners):
                log = home / f"runner-{i}.log"
                logs.append(log)
                with log.open("w") as err:
                    procs.append(
                        subprocess.Popen(
                            CLI + ["runner", "--server", url, "--name", f"bench-{i}"],
                            stdout=subprocess.DEVNULL,
                            stderr=err,
                            env=env,
                        )  # fmt: skip
                    )
            deadline = time.monotonic() + 60
            while not all("registered as" in p.read_text() for p in logs):
                if time.monotonic() > deadline:
                    raise RuntimeError("runners did not register")
                time.sleep(0.1)
            _say(start, f"{runners} runner(s) registered; submitting")
            t0 = time.monotonic()
            done = subprocess.run(
                CLI + ["submit", str(REPRO), "--package", "leakyfixture"]
                + ["--range", "1.0.0..1.0.9", "--index-url", index, "--wait", "--json"]
                + ["--server", url, "--no-reuse", "--no-attribute"],  # the release search
                capture_output=True, text=True, env=env, timeout=600,
            )  # fmt: skip
            wall = time.monotonic() - t0
            _say(start, "submit --wait returned")
            if done.returncode != 0:
                raise RuntimeError(f"submit exited {done.returncode}: {done.stderr}")
            report = json.loads(done.stdout)
            with ApiClient(url) as client:
                job = client.get_job(report["job_id"])
            created = datetime.fromisoformat(str(job["created_at"]))
            finished = datetime.fromisoformat(str(job["finished_at"]))
            return {
                "runners": runners,
                "wall_s": wall,
                "job_s": (finished - created).total_seconds(),
                "trials": report["trials"],
                "answer": f"{report['last_good']}..{report['first_bad']}",
            }
        finally:
            # Runners first (they leave through the API), then the server.
            for group in (procs, [serve]):
                for proc in group:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
                for proc in group:
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            _say(start, "stopped")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_report(path: Path, rows: list[dict[str, Any]], command: str) -> None:
    lines = [
        "# End-to-end service benchmark (fixture bisection, 1 vs 2 runners)",
        "",
        "Written by `bench/service_e2e.py`. `bisect-cli serve --runners 0` (SQLite) and N",
        "`bisect-cli runner` processes on one machine; the timed command is",
        "`bisect-cli submit service/example/repro.py --package leakyfixture --range",
        "1.0.0..1.0.9 --index-url <offline fixture index> --wait --json` (started once every",
        "runner has registered; warm uv cache, fresh database and environments per run).",
        "Each trial runs the repro for about 2 s; environments build in about 0.3 s.",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}",
        f"- Command: `{command}`",
        "",
        "| Runners | submit --wait wall time | job on the server (created -> finished) "
        "| Trials | Answer (last good..first bad) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['runners']} | {r['wall_s']:.1f} s | {r['job_s']:.1f} s | {r['trials']} "
            f"| {r['answer']} |"
        )
    by_n: dict[int, list[float]] = {}
    for r in rows:
        by_n.setdefault(r["runners"], []).append(r["wall_s"])
    if len(by_n) > 1:
        lines += ["", "Median wall time per runner count: " + ", ".join(
            f"{n} runner{'s' if n != 1 else ''}: {statistics.median(v):.1f} s"
            for n, v in sorted(by_n.items())
        ) + "."]  # fmt: skip
    lines += [
        "",
        "Notes: with more runners the scheduler asks the planner for as many candidates as",
        "there are live runners (k-section), so the bound checks, the search rounds and the",
        "final confirmation of the boundary pair run side by side. The gap between the wall",
        "time and the job's own time is the CLI's interpreter start, the submission (the",
        "server lists the releases and resolves the good bound's pins with uv) and up to one",
        "1 s poll interval. Trial counts differ when a run is judged inconclusive and is run",
        "again. Runners and server share the machine's CPUs with the trials.",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runners", default="1,2", help="comma-separated runner counts")
    ap.add_argument("--repeat", type=int, default=1, help="runs per runner count")
    ap.add_argument("--report", type=Path, default=REPO / "docs" / "bench-service.md")
    ap.add_argument("--no-warmup", action="store_true", help="skip the uncounted first run")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.runners.split(",") if n.strip()]
    rows = []
    with reachable_tmpdir(prefix="leakbisect-bench-uv-") as cache:
        wheels = build_fixture(Path(cache) / "wheels")
        with serve_index(wheels) as index:
            uv_cache = Path(cache) / "uv"
            if not args.no_warmup:
                warm = one_run(max(counts), index, uv_cache)
                print(f"warm-up: {warm['wall_s']:.1f}s", file=sys.stderr)
            for _ in range(args.repeat):
                for n in counts:
                    row = one_run(n, index, uv_cache)
                    print(
                        f"{n} runner(s): {row['wall_s']:.1f}s wall, job {row['job_s']:.1f}s, "
                        f"{row['trials']} trials, {row['answer']}",
                        file=sys.stderr,
                    )
                    rows.append(row)
    command = "uv run python bench/service_e2e.py " + " ".join(argv or sys.argv[1:])
    write_report(args.report, rows, command.strip())
    print(f"wrote {args.report}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
