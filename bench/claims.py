"""Claim throughput on Postgres: N simulated runners claim and finish a fixed set of trials.

    uv run python bench/claims.py [--runners 50] [--trials 5000] [--report docs/bench-claims.md]

Creates a scratch database next to BISECT_TEST_PG's (default postgres@127.0.0.1:5432), migrates
it, queues the trials, then starts every runner at once: each is a thread with its own Session
(so its own connection) that claims, finishes and commits until the queue is empty. Double
claims are counted twice over: trial ids handed out more than once, and trials whose stored
attempt is not 1. The database is dropped afterwards.
"""

import argparse
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: bench/ is not an installed package

from sqlalchemy import create_engine, func, insert, text  # noqa: E402
from sqlmodel import Session, col, select  # noqa: E402

from bench.common import write_report  # noqa: E402
from service import queue  # noqa: E402
from service.db import upgrade  # noqa: E402
from service.models import Candidate, Job, Runner, Trial, TrialStatus, utcnow  # noqa: E402

ADMIN_URL = os.environ.get(
    "BISECT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def seed(url: str, trials: int) -> None:
    engine = create_engine(url)
    with Session(engine) as session:
        job = Job(package="pkg", good="1", bad="2", script="pass", script_sha256="0")
        session.add(job)
        session.flush()
        candidate = Candidate(job_id=job.id, position=0, version="1")
        session.add(candidate)
        session.flush()
        queued = Trial(job_id=job.id, candidate_id=candidate.id).model_dump(exclude={"id"})
        rows = [queued | {"evaluation": n, "number": n} for n in range(1, trials + 1)]
        session.exec(insert(Trial), params=rows)
        session.commit()
    engine.dispose()


def run(url: str, runners: int, deadline_s: float) -> dict:
    engine = create_engine(url, pool_size=runners, max_overflow=0)
    claims: list[int] = []
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(runners + 1)
    stop_at = [0.0]

    def runner(n: int) -> None:
        me = Runner(id=f"bench-{n}", name=f"bench-{n}")
        mine, times = [], []
        with Session(engine) as session:
            session.exec(select(1)).one()  # connect before the clock starts
            session.commit()
            start.wait()
            try:
                while time.monotonic() < stop_at[0]:
                    t0 = time.perf_counter()
                    trial = queue.claim(session, me, lease_s=300)
                    times.append(time.perf_counter() - t0)
                    if trial is None:
                        break
                    mine.append(trial.id)
                    trial = queue.lock_for_report(session, trial.id, me.id, trial.attempt)
                    trial.status, trial.verdict, trial.finished_at = (
                        TrialStatus.DONE,
                        "clean",
                        utcnow(),
                    )
                    session.commit()
            except Exception as exc:  # report it; the counts below show what was lost
                errors.append(f"{me.id}: {exc!r}")
        with lock:
            claims.extend(mine)
            latencies.extend(times)

    threads = [threading.Thread(target=runner, args=(n,)) for n in range(runners)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.monotonic() + deadline_s
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0

    with Session(engine) as session:
        done = session.exec(select(func.count()).where(col(Trial.status) == TrialStatus.DONE)).one()
        reattempted = session.exec(select(func.count()).where(col(Trial.attempt) > 1)).one()
        pg_version = session.exec(select(func.version())).one()
    engine.dispose()
    counts = Counter(claims)
    latencies.sort()
    return {
        "claims": len(claims),
        "distinct": len(counts),
        "double_claims": sum(n - 1 for n in counts.values() if n > 1) + reattempted,
        "done": done,
        "elapsed_s": elapsed,
        "claims_per_s": len(claims) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "errors": errors,
        "postgres": pg_version.split(" on ")[0],
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        models = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = models[0] if models else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def report(path: Path, args: argparse.Namespace, r: dict) -> str:
    command = f"uv run python bench/claims.py --runners {args.runners} --trials {args.trials}"
    text_ = f"""# Claim benchmark (Postgres, `FOR UPDATE SKIP LOCKED`)

Written by `bench/claims.py`. {args.runners} runner threads, each with its own connection,
claim a trial, lock it with `queue.lock_for_report`, mark it done and commit, until {args.trials}
queued trials are gone. Database and runners share one machine, so this measures the
queue's SQL and Python's overhead, not the network.

- Machine: {machine()}
- Database: {r["postgres"]}, local TCP; Python {platform.python_version()}
- Command: `{command}`

| Figure | Value |
| --- | --- |
| Trials claimed and finished | {r["claims"]} of {args.trials} ({r["done"]} done in the database) |
| Wall time | {r["elapsed_s"]:.2f} s |
| Claims per second (claim + finish + commit each) | {r["claims_per_s"]:.0f} |
| Claim latency p50 / p99 | {r["p50_ms"]:.1f} ms / {r["p99_ms"]:.1f} ms |
| Double claims | **{r["double_claims"]}** |
| Runner errors | {len(r["errors"])} |
"""
    return write_report(path, text_)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runners", type=int, default=50)
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--max-seconds", type=float, default=90, help="stop claiming after this")
    parser.add_argument("--report", type=Path, default=Path("docs/bench-claims.md"))
    args = parser.parse_args()

    name = f"leakbisect_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        upgrade(url)
        seed(url, args.trials)
        result = run(url, args.runners, args.max_seconds)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    print(report(args.report, args, result))
    for error in result["errors"]:
        print("error:", error, file=sys.stderr)
    complete = result["claims"] == result["distinct"] == result["done"] == args.trials
    return 0 if complete and result["double_claims"] == 0 and not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
