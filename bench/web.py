"""The status page's render times for a big job, through a real `serve`.

    uv run python bench/web.py [--requests 60] [--database-url URL] [--report docs/bench-web.md]

1. Seeds a database (SQLite in a scratch directory unless --database-url names one) with a
   job of 10 candidates: the first bad holds 20 finished trials of 36,000 samples each (an
   hour at 10 Hz, with checkpoint spikes and a rising floor), judged by the real classifier;
   another candidate holds one trial of 120,000 samples; the rest one trial each.
2. Starts `python -m service.cli serve --runners 0 --port 0 --json` on it.
3. Times, with one client in a closed loop, each of: the job list, the job page (first bad
   selected: 20 trial sections), its live fragment (what SSE and the 30 s poll re-fetch), the
   page with the 120,000-sample candidate selected, each trial's curve JSON cold (first
   request: load and downsample) and warm (finished trials are cached).
4. Writes p50 / p95 / max per request kind, with the payload size and the machine.

The target (issue 10): job page p95 under 150 ms for 20 trials of 36,000 samples.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import insert
from sqlmodel import Session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from engine.analysis import classify_run  # noqa: E402
from service.db import get_engine, upgrade  # noqa: E402
from service.models import Candidate, Job, MemorySample, Trial, TrialStatus, utcnow  # noqa: E402
from service.store import next_trial_number  # noqa: E402
from service.web.views import MAX_POINTS  # noqa: E402

MIB = 1024 * 1024
TRIALS, SAMPLES, LONG = 20, 36_000, 120_000


def series(n: int, seed: int, leak: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t (s), RSS (bytes) and step of a run at 10 Hz: noise, spikes every 600 samples, and a
    floor rising by 40 MiB over the run when `leak`."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) * 0.1
    rss = 500 * MIB + rng.normal(0, 2 * MIB, n)
    rss[(np.arange(n) % 600) < 30] += 300 * MIB
    if leak:
        rss += np.linspace(0, 40 * MIB, n)
    return t, rss.astype(np.int64), np.arange(n) // 100


def add_trial(session: Session, job: Job, cand: Candidate, n: int, seed: int, leak: bool) -> None:
    t, rss, step = series(n, seed, leak)
    starts = [(float(t[i]), int(step[i])) for i in range(0, n, 100)]
    run = classify_run(
        t.tolist(), rss.tolist(), None, starts, exit_code=0, oom_killed=False, timed_out=False
    )
    analysis = run.to_dict()
    analysis["growth_mib"] = analysis["host"]["growth_mib"]
    now = utcnow()
    trial = Trial(
        job_id=job.id,
        number=next_trial_number(session, job.id),  # type: ignore[arg-type]
        candidate_id=cand.id,
        status=TrialStatus.DONE,
        attempt=1,
        runner_id="bench-runner",
        started_at=now - timedelta(seconds=n / 10),
        finished_at=now,
        exit_code=0,
        duration_s=n / 10,
        verdict=run.verdict.value,
        analysis=analysis,
        log_tail="step 1\n" * 200,
        cap_method="cgroup-v2",
    )
    session.add(trial)
    session.flush()
    rows = [
        {
            "trial_id": trial.id,
            "t": float(a),
            "rss": int(b),
            "anon": int(b * 0.9),
            "shared": int(b * 0.1),
            "step": int(c),
        }
        for a, b, c in zip(t, rss, step, strict=True)
    ]
    for i in range(0, len(rows), 20_000):
        session.execute(insert(MemorySample), rows[i : i + 20_000])


def seed(url: str) -> tuple[int, str, str]:
    """The job; returns its id, the first bad and the long trial's candidate."""
    upgrade(url)
    versions = [f"2.{i}" for i in range(10)]
    script = "print('bench')\n"
    with Session(get_engine(url)) as session:
        job = Job(
            package="bench-pkg",
            script=script,
            script_sha256=hashlib.sha256(script.encode()).hexdigest(),
            good=versions[0],
            bad=versions[-1],
            status="found",
            finished_at=utcnow(),
            result={"status": "found", "last_old": "2.4", "first_new": "2.5", "skipped": []},
            message="first bad is 2.5 and last good is 2.4",
        )
        session.add(job)
        session.flush()
        for i, version in enumerate(versions):
            leak = i >= 5
            cand = Candidate(
                job_id=job.id,
                position=i,
                version=version,
                verdict="leak" if leak else "clean",
                evaluations=["leak" if leak else "clean"],
                growth_mib=40.0 if leak else 0.0,
                freeze=[f"bench-pkg=={version}", "numpy==2.0.0"],
            )
            session.add(cand)
            session.flush()
            if version == "2.5":
                for k in range(TRIALS):
                    add_trial(session, job, cand, SAMPLES, 100 + k, leak=True)
            elif version == "2.8":
                add_trial(session, job, cand, LONG, 7, leak=True)
            else:
                add_trial(session, job, cand, 600, i, leak=leak)
        session.commit()
        assert job.id is not None
        return job.id, "2.5", "2.8"


def serve(url: str, home: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--runners",
            "0",
            "--port",
            "0",
            "--json",
            "--database-url",
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=(home / "serve.log").open("w"),
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"serve did not start: {(home / 'serve.log').read_text()[-2000:]}")
    return proc, json.loads(line)["url"]


def timed(client: httpx.Client, path: str, n: int) -> dict[str, Any]:
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
        size = len(r.content)
    return summary(times, size)


def summary(times: list[float], size: int) -> dict[str, Any]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {
        "n": len(times),
        "p50": statistics.median(ordered),
        "p95": p95,
        "max": ordered[-1],
        "bytes": size,
    }


def measure(base: str, job: int, first_bad: str, long_one: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=60) as client:
        for path in ("/", f"/jobs/{job}"):
            client.get(path)  # warm-up: imports, templates, connection pool
        html = client.get(f"/jobs/{job}").text
        curves = sorted(set(__import__("re").findall(r'data-curve="([^"]+)"', html)))
        long_html = client.get(f"/jobs/{job}?candidate={long_one}").text
        long_curve = __import__("re").findall(r'data-curve="([^"]+)"', long_html)
        out["job list `/`"] = timed(client, "/", n)
        out[f"job page, first bad selected ({TRIALS} trials x {SAMPLES:,} samples)"] = timed(
            client, f"/jobs/{job}", n
        )
        out["live fragment (SSE / poll re-fetch)"] = timed(
            client, f"/jobs/{job}/fragments/live?candidate={first_bad}", n
        )
        out[f"job page, {LONG:,}-sample trial selected"] = timed(
            client, f"/jobs/{job}?candidate={long_one}", n
        )
        cold = [timed(client, c, 1) for c in curves]
        out[f"curve JSON cold ({SAMPLES:,} samples -> <= {MAX_POINTS})"] = summary(
            [c["p50"] for c in cold], cold[-1]["bytes"]
        )
        out[f"curve JSON cold ({LONG:,} samples)"] = timed(client, long_curve[0], 1)
        out["curve JSON warm (cached)"] = timed(client, curves[0], n)
        t0 = time.perf_counter()
        client.get(f"/jobs/{job}")
        for c in curves:
            client.get(c)
        out["_whole"] = (time.perf_counter() - t0) * 1000
    return out


def report(results: dict[str, Any], path: Path, command: str, db: str) -> None:
    whole = results.pop("_whole")
    info = machine()
    lines = [
        "# Status page render times",
        "",
        f"Written by `{command}` (bench/web.py). A job of 10 candidates whose first bad holds "
        f"{TRIALS} finished trials of {SAMPLES:,} samples each (an hour at 10 Hz), plus one "
        f"trial of {LONG:,} samples, on {db}, served by `bisect-cli serve --runners 0`; one "
        "client in a closed loop (httpx, keep-alive). Curves are downsampled on the server to "
        f"at most {MAX_POINTS} points per trial (min and max per time bucket, "
        "contract/series.py), so the page's cost does not grow with the run's length.",
        "",
        "| request | n | p50 ms | p95 ms | max ms | bytes |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['n']} | {r['p50']:.1f} | {r['p95']:.1f} | {r['max']:.1f} "
            f"| {r['bytes']:,} |"
        )
    target = results[f"job page, first bad selected ({TRIALS} trials x {SAMPLES:,} samples)"]["p95"]
    lines += [
        "",
        f"Target: job page p95 < 150 ms: **{target:.1f} ms** "
        f"({'met' if target < 150 else 'missed'}).",
        f"The job page plus all {TRIALS} of its curves fetched once after the cache was warm: "
        f"{whole:.0f} ms.",
        "",
        "The page HTML carries no samples: each trial's curve is fetched by the browser as JSON "
        "(at most 2,000 points) and drawn with uPlot; a finished trial's downsampled curve is "
        "cached in the serving process (128 trials), so only its first request loads the "
        'samples. The live fragment is what every SSE "job N changed" event re-fetches.',
        "",
        "A cold curve costs time in proportion to the samples stored (loading the rows dominates; "
        "the min/max downsampling is about a tenth of it). A runner uploads at most "
        "`MAX_REPORT_SAMPLES` (20,000) samples per trial, downsampling longer runs itself, so a "
        "stored trial is never longer than that however long it ran; the 36,000 and 120,000 "
        "sample trials here are beyond what the service stores, seeded directly.",
        "",
        f"Machine: {info['summary']}; revision {info['revision']}.",
        "",
    ]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60, help="requests per measured kind")
    ap.add_argument("--database-url", default=None, help="default: SQLite in a scratch dir")
    ap.add_argument("--report", type=Path, default=ROOT / "docs" / "bench-web.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        home = Path(tmp)
        url = args.database_url or f"sqlite:///{home / 'bench.db'}"
        t0 = time.perf_counter()
        job, first_bad, long_one = seed(url)
        print(f"seeded job {job} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        proc, base = serve(url, home)
        try:
            results = measure(base, job, first_bad, long_one, args.requests)
        finally:
            proc.terminate()
            proc.wait(30)
    db = "Postgres" if url.startswith("postgresql") else "SQLite"
    command = "uv run python bench/web.py" + (
        f" --requests {args.requests}" if args.requests != 60 else ""
    )
    report(results, args.report, command, db)
    print(args.report.read_text())


if __name__ == "__main__":
    main()
