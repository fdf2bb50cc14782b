"""API load on Postgres: claims per second through HTTP with N simulated runners, and the
latency of `GET /api/v1/jobs/{id}` meanwhile.

    uv run python bench/api_load.py [--runners 50] [--trials 4000] [--max-seconds 60]
                                    [--report docs/bench-api.md]

What it does, in order:

1. Creates a scratch database next to BISECT_TEST_PG's (default postgres@127.0.0.1:5432) and
   migrates it (`service.db.upgrade`, what `bisect-cli db upgrade` runs).
2. Seeds it with the SQLModel tables, so no package index or uv is needed:
   - one *watched* job of realistic size (30 candidates, 3 repeats, 76 finished trials with
     their samples, stored by the service's own `record_report` and closed by its own
     `advance`): 8 clean releases, 8 leaking ones and 14 in between still running. It is
     static during the run, so its `GET` is the same response with and without load.
   - *hot* jobs of 25 candidates each whose queued trials the runners work through, oldest
     first, so like real k-section rounds most of the 50 runners are on one job at a time.
   Every candidate of every job also holds one trial leased to a parked runner for a day.
   That keeps each candidate's evaluation open, so `complete` still runs the whole real path
   (lease check, report with samples, classifier, `advance` under the job's row lock loading
   the job's candidates and trials, asking the planner) but the planner has nothing new to
   pick and no job finishes: the seeded trials are exactly the work, and every one is claimed
   at most once. This is checked before the run by calling `advance` on every job.
3. Starts the real API in a subprocess, `python -m service.cli serve --runners 0 --port 0
   --json --database-url ... [--workers N]` (no tokens, so 127.0.0.1 only; default lease,
   heartbeat and maintenance settings: the reaper and its advance of every open job run every
   5 s, in each worker).
4. Measures a baseline: GET of the watched job with nothing else running.
5. In a second process (so that their Python does not share a GIL with the reader), N runner
   threads, each with its own `runners.client.ApiClient` (retries off: every error counts),
   register, then at once: lease (`wait=1`), heartbeat once, complete with a small report
   (120 flat samples: 60 s at 2 Hz), until every seeded trial is claimed or --max-seconds.
   Meanwhile the reader(s) GET the watched job in a closed loop.
6. Checks double claims twice over: trial ids leased more than once as seen by the runners,
   and in the database trials whose attempt is not 1 or whose runner is not the one that
   leased it. Writes the report, stops the server and drops the database.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import selectors
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from sqlalchemy import create_engine, func, insert, text  # noqa: E402
from sqlmodel import Session, col, select  # noqa: E402

from bench.common import machine, reachable_tmpdir, write_report  # noqa: E402
from contract.wire import API_PREFIX, EnvResult, Sample, TrialReport  # noqa: E402
from runners.client import ApiClient, ApiError, ApiUnreachable  # noqa: E402
from service import queue  # noqa: E402
from service.db import upgrade  # noqa: E402
from service.models import (  # noqa: E402
    Candidate,
    Job,
    JobStatus,
    MemorySample,
    Runner,
    Trial,
    TrialStatus,
    utcnow,
)
from service.scheduler import advance, slots_for  # noqa: E402
from service.store import candidates_of, next_trial_number, trials_of  # noqa: E402
from service.trials import record_report  # noqa: E402

ADMIN_URL = os.environ.get(
    "BISECT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
CLI = [sys.executable, "-m", "service.cli"]
MIB = 1024 * 1024
PARKED = "bench-parked"
SCRIPT = "import leakyfixture\nfor _ in range(40):\n    leakyfixture.step()\n"
WATCHED_CANDIDATES = 30
WATCHED_REPEATS = 3
HOT_CANDIDATES = 25


# ------------------------------------------------------------------------------ seeding


def series(n: int, leaks: bool) -> list[Sample]:
    """n samples at 2 Hz: +1 MiB per sample for a leak, flat with a little jitter otherwise."""
    return [
        Sample(t=i * 0.5, rss=int((500 + (i if leaks else 0) + (i * 7) % 5) * MIB))
        for i in range(n)
    ]


def report_for(trial: Trial, version: str, samples: list[Sample]) -> TrialReport:
    assert trial.id is not None
    return TrialReport(
        trial_id=trial.id,
        attempt=trial.attempt,
        runner_id=trial.runner_id,
        env=EnvResult(ok=True, freeze=[f"leakyfixture=={version}"], resolution="constrained"),
        exit_code=0,
        duration_s=60.0,
        log_tail=f"ran {version}\n",
        samples=samples,
    )


def new_job(session: Session, good: str, bad: str, repeats: int) -> Job:
    job = Job(
        package="leakyfixture",
        good=good,
        bad=bad,
        script=SCRIPT,
        script_sha256=hashlib.sha256(SCRIPT.encode()).hexdigest(),
        repeats=repeats,
        status=JobStatus.RUNNING,
        constraints=["numpy==1.26.4"],
        machine={"cpu": "bench"},
    )
    session.add(job)
    session.flush()
    return job


def parked(job: Job, candidate: Candidate, number: int) -> Trial:
    """A trial leased for a day to a runner that never reports: the evaluation stays open."""
    now = utcnow()
    return Trial(
        job_id=job.id,  # type: ignore[arg-type]
        number=number,
        candidate_id=candidate.id,  # type: ignore[arg-type]
        status=TrialStatus.LEASED,
        attempt=1,
        runner_id=PARKED,
        started_at=now,
        lease_expires_at=now + timedelta(days=1),
    )


def seed_watched(session: Session, samples: int) -> int:
    """30 candidates: 0-7 clean and 22-29 leaking (3 runs each, judged), 8-21 running with
    2 of their 3 runs reported. Reports go through `record_report`, verdicts through `advance`.
    """
    last = WATCHED_CANDIDATES - 1
    job = new_job(session, "1.0.0", f"1.0.{last}", WATCHED_REPEATS)
    for position in range(WATCHED_CANDIDATES):
        version = f"1.0.{position}"
        candidate = Candidate(job_id=job.id, position=position, version=version)  # type: ignore[arg-type]
        session.add(candidate)
        session.flush()
        first = position * WATCHED_REPEATS + 1
        trials = [parked(job, candidate, first + k) for k in range(WATCHED_REPEATS)]
        session.add_all(trials)
        session.commit()
        judged = position < 8 or position > 21
        for trial in trials if judged else trials[:-1]:
            run = series(samples, leaks=position >= 15)
            record_report(session, job, candidate, trial, report_for(trial, version, run))
    step = advance(session, job, slots=50)
    assert step.run == () and step.outcome is None, step
    judged = session.exec(
        select(func.count()).where(col(Candidate.job_id) == job.id, col(Candidate.verdict) != None)  # noqa: E711
    ).one()
    assert judged == 16, judged
    assert job.id is not None
    return job.id


def seed_hot(session: Session, trials: int, per_candidate: int) -> list[int]:
    """Jobs of 25 candidates; `trials` queued trials in all, job after job (claim order)."""
    per_job = HOT_CANDIDATES * per_candidate
    job_ids, rows = [], []
    for n in range(-(-trials // per_job)):
        job = new_job(session, "2.0.0", f"2.0.{HOT_CANDIDATES - 1}", repeats=1)
        job_ids.append(job.id)
        candidates = [
            Candidate(job_id=job.id, position=p, version=f"2.0.{p}")  # type: ignore[arg-type]
            for p in range(HOT_CANDIDATES)
        ]
        session.add_all(candidates)
        session.flush()
        session.add_all(parked(job, c, k + 1) for k, c in enumerate(candidates))
        left = min(per_job, trials - n * per_job)
        for i in range(left):
            candidate = candidates[i % HOT_CANDIDATES]
            number = HOT_CANDIDATES + i + 1
            queued = Trial(job_id=job.id, candidate_id=candidate.id, number=number)  # type: ignore[arg-type]
            rows.append(queued.model_dump(exclude={"id"}))
    session.commit()
    session.exec(insert(Trial), params=rows)
    session.commit()
    return job_ids


def seed(url: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = create_engine(url)
    with Session(engine) as session:
        session.add(Runner(id=PARKED, name=PARKED, active=False))
        session.commit()
        watched = seed_watched(session, args.samples)
        hot = seed_hot(session, args.trials, args.per_candidate)
        before = session.exec(select(func.count()).select_from(Trial)).one()
        for job_id in [watched, *hot]:
            job = session.get(Job, job_id)
            assert job is not None
            step = advance(session, job, slots=args.runners)
            assert step.run == () and step.outcome is None, (job_id, step)
        after = session.exec(select(func.count()).select_from(Trial)).one()
        assert before == after, "advance queued trials: the seeded jobs are not inert"
        queued = session.exec(
            select(func.count()).where(col(Trial.status) == TrialStatus.QUEUED)
        ).one()
        job = session.get(Job, watched)
        assert job is not None
        watched_trials = trials_of(session, job)
        watched_samples = session.exec(
            select(func.count())
            .select_from(MemorySample)
            .where(col(MemorySample.trial_id).in_([t.id for t in watched_trials]))
        ).one()
        pg = session.exec(select(func.version())).one()
    engine.dispose()
    assert queued == args.trials, queued
    return {
        "watched": watched,
        "hot_jobs": hot,
        "queued": queued,
        "watched_trials": len(watched_trials),
        "watched_done": sum(1 for t in watched_trials if t.status == TrialStatus.DONE),
        "watched_samples": watched_samples,
        "postgres": pg.split(" on ")[0],
    }


# ------------------------------------------------------------------------------ server


def start_server(url: str, home: Path, workers: int = 1) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BISECT_")}
    env.update(XDG_DATA_HOME=str(home / "data"), XDG_CACHE_HOME=str(home / "cache"))
    log = (home / "serve.log").open("w")
    proc = subprocess.Popen(
        CLI
        + ["serve", "--runners", "0", "--port", "0", "--json", "--database-url", url]
        + ["--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        cwd=home,
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    line = proc.stdout.readline() if sel.select(60) else ""
    if not line:
        proc.kill()
        raise RuntimeError(f"serve did not start:\n{(home / 'serve.log').read_text()}")
    return proc, json.loads(line)["url"]


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------ clients


def client(api: str) -> ApiClient:
    return ApiClient(api, retries=0)


def read_loop(api: str, job_id: int, stop: threading.Event, out: list[tuple[float, float]],
              errors: list[str], size: list[int]) -> None:  # fmt: skip
    """GET the job until `stop`; (start, seconds) per request."""
    with client(api) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                response = c.request("GET", f"/jobs/{job_id}")
            except (ApiError, ApiUnreachable) as exc:
                errors.append(f"GET /jobs/{job_id}: {exc}")
                continue
            out.append((t0, time.monotonic() - t0))
            size[0] = len(response.content)


def read_for(api: str, job_id: int, readers: int, seconds: float) -> tuple[list, list, int]:
    stop = threading.Event()
    out: list[tuple[float, float]] = []
    errors: list[str] = []
    size = [0]
    threads = [
        threading.Thread(target=read_loop, args=(api, job_id, stop, out, errors, size))
        for _ in range(readers)
    ]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return out, errors, size[0]


def runner_process(api: str, runners: int, target: int, max_s: float, samples: int, conn) -> None:  # type: ignore[no-untyped-def]
    """N runner threads in this process: register, then on "go" lease/heartbeat/complete."""
    clients = [client(api) for _ in range(runners)]
    capabilities = {"memory_bytes": 64 << 30, "cpus": 8, "pythons": ["3.12"]}
    ids = []
    secret: dict[str, dict[str, str]] = {}  # runner id -> its X-Runner-Secret header
    for n, c in enumerate(clients):
        body = {"name": f"bench-{n}", "capabilities": capabilities, "labels": {"bench": "api"}}
        registered = c.request("POST", "/runners", json=body).json()
        ids.append(registered["runner_id"])
        secret[registered["runner_id"]] = {"X-Runner-Secret": registered["runner_secret"]}
    report = TrialReport(
        trial_id=0,
        env=EnvResult(ok=True, freeze=["leakyfixture==2.0.0"], resolution="constrained"),
        exit_code=0,
        duration_s=60.0,
        log_tail="ran\n",
        samples=series(samples, leaks=False),
    ).model_dump(mode="json")

    lock = threading.Lock()
    claimed = [0]
    leases: list[tuple[int, int, str]] = []
    latency: dict[str, list[float]] = defaultdict(list)
    requests: Counter[str] = Counter()
    errors: list[str] = []
    last_done = [0.0]
    conn.send("ready")
    conn.recv()
    go = time.monotonic()
    stop_at = go + max_s

    def run(c: ApiClient, runner_id: str) -> None:
        mine: dict[str, list[float]] = defaultdict(list)
        got: list[tuple[int, int, str]] = []
        counts: Counter[str] = Counter()
        done_at = 0.0
        try:
            while time.monotonic() < stop_at and claimed[0] < target:
                t0 = time.monotonic()
                response = c.request(
                    "POST",
                    f"/runners/{runner_id}/lease",
                    params={"wait": 1},
                    headers=secret[runner_id],
                )
                mine["lease"].append(time.monotonic() - t0)
                if response.status_code == 204:
                    counts["lease 204"] += 1
                    continue
                counts["lease 200"] += 1
                spec = response.json()["trial"]
                trial_id, attempt = spec["trial_id"], spec["attempt"]
                got.append((trial_id, attempt, runner_id))
                with lock:
                    claimed[0] += 1
                beat = {"runner_id": runner_id, "attempt": attempt, "rss": 500 * MIB}
                t0 = time.monotonic()
                path = f"/trials/{trial_id}/heartbeat"
                c.request("POST", path, json=beat, headers=secret[runner_id])
                mine["heartbeat"].append(time.monotonic() - t0)
                counts["heartbeat"] += 1
                body = report | {"trial_id": trial_id, "attempt": attempt, "runner_id": runner_id}
                t0 = time.monotonic()
                path = f"/trials/{trial_id}/complete"
                verdict = c.request("POST", path, json=body, headers=secret[runner_id]).json()
                done_at = time.monotonic()
                mine["complete"].append(done_at - t0)
                counts["complete"] += 1
                if verdict.get("verdict") != "clean":
                    raise RuntimeError(f"trial {trial_id}: verdict {verdict}")
        except Exception as exc:  # noqa: BLE001 - counted and reported, never hidden
            errors.append(f"{runner_id}: {type(exc).__name__}: {exc}")
        with lock:
            leases.extend(got)
            for kind, values in mine.items():
                latency[kind].extend(values)
            requests.update(counts)
            last_done[0] = max(last_done[0], done_at)

    threads = [threading.Thread(target=run, args=(c, r)) for c, r in zip(clients, ids, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for c, runner_id in zip(clients, ids, strict=True):
        c.request("DELETE", f"/runners/{runner_id}", headers=secret[runner_id])
        c.close()
    conn.send(
        {
            "go": go,
            "last_done": last_done[0],
            "leases": leases,
            "latency": dict(latency),
            "requests": dict(requests),
            "errors": errors,
        }
    )


# ------------------------------------------------------------------------------ the run


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": float("nan"), "p95": float("nan"), "p99": float("nan"),
                "max": float("nan")}  # fmt: skip
    ms = sorted(1000 * v for v in values)

    def q(p: float) -> float:
        return ms[min(len(ms) - 1, round(p * (len(ms) - 1)))]

    return {"n": len(ms), "p50": statistics.median(ms), "p95": q(0.95), "p99": q(0.99),
            "max": ms[-1]}  # fmt: skip


def verify(url: str, hot_jobs: list[int], leases: list[tuple[int, int, str]]) -> dict[str, int]:
    """Double claims and lost work, from the database."""
    engine = create_engine(url)
    with Session(engine) as session:
        rows = session.exec(
            select(Trial.id, Trial.status, Trial.attempt, Trial.runner_id).where(
                col(Trial.job_id).in_(hot_jobs), col(Trial.runner_id).is_distinct_from(PARKED)
            )
        ).all()
        samples = session.exec(select(func.count()).select_from(MemorySample)).one()
    engine.dispose()
    db = {r[0]: r for r in rows}
    by_status = Counter(r[1] for r in rows)
    reattempted = sum(1 for r in rows if r[2] > 1)
    mismatched = sum(
        1
        for trial_id, attempt, runner_id in leases
        if trial_id not in db or db[trial_id][1:] != (TrialStatus.DONE, attempt, runner_id)
    )
    return {
        "done": by_status[TrialStatus.DONE],
        "leased": by_status[TrialStatus.LEASED],
        "queued": by_status[TrialStatus.QUEUED],
        "reattempted": reattempted,
        "mismatched": mismatched,
        "samples": samples,
    }


def server_cpu_s(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def run(url: str, args: argparse.Namespace, seeded: dict[str, Any], home: Path) -> dict[str, Any]:
    server, base = start_server(url, home, args.workers)
    api = f"{base}{API_PREFIX}"
    # The server's CPU: serve and its worker processes (--workers), started by now.
    procs = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    try:
        watched = seeded["watched"]
        read_for(api, watched, 1, 1.0)  # warm up: first requests, connection pool
        baseline, base_errors, size = read_for(api, watched, args.readers, args.baseline_seconds)

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        worker = ctx.Process(
            target=runner_process,
            args=(api, args.runners, seeded["queued"], args.max_seconds, args.samples, child),
        )
        worker.start()
        if not parent.poll(60):
            raise RuntimeError("the runner process did not register its runners")
        assert parent.recv() == "ready"
        stop = threading.Event()
        loaded: list[tuple[float, float]] = []
        load_errors: list[str] = []
        size_box = [0]
        readers = [
            threading.Thread(
                target=read_loop, args=(api, watched, stop, loaded, load_errors, size_box)
            )
            for _ in range(args.readers)
        ]
        cpu0 = server_cpu_s(procs)
        psutil.cpu_percent()
        t0 = time.monotonic()
        parent.send("go")
        for thread in readers:
            thread.start()
        if not parent.poll(args.max_seconds + 60):
            raise RuntimeError("the runner process did not finish")
        result = parent.recv()
        stop.set()
        for thread in readers:
            thread.join()
        system_cpu = psutil.cpu_percent()
        cpu1 = server_cpu_s(procs)
        worker.join(30)
        wall = time.monotonic() - t0
    finally:
        stop_server(server)

    go, end = result["go"], result["last_done"]
    elapsed = end - go
    under = [s for start, s in loaded if go <= start <= end]
    leases = result["leases"]
    counts = Counter(trial_id for trial_id, _, _ in leases)
    db = verify(url, seeded["hot_jobs"], leases)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    server_cpu = cpu1 - cpu0
    return {
        "claims": len(leases),
        "completed": result["requests"].get("complete", 0),
        "elapsed_s": elapsed,
        "claims_per_s": len(leases) / elapsed if elapsed > 0 else 0.0,
        "duplicates": duplicates,
        "double_claims": duplicates + db["reattempted"] + db["mismatched"],
        "db": db,
        "requests": result["requests"],
        "runner_latency": {k: quantiles(v) for k, v in result["latency"].items()},
        "baseline": quantiles([s for _, s in baseline]),
        "under_load": quantiles(under),
        "get_errors": base_errors + load_errors,
        "response_bytes": size,
        "errors": result["errors"],
        "server_cpu_pct": 100 * server_cpu / wall,
        "system_cpu_pct": system_cpu,
        "log": (home / "serve.log").read_text()[-4000:],
    }


def breakdown(url: str, args: argparse.Namespace, seeded: dict[str, Any]) -> dict[str, float]:
    """Mean ms per step of the same path, in this process, one thread, nothing else running:
    where a claim's server time goes. Runs after the server stopped, on fresh queued trials."""
    n = args.breakdown_trials
    engine = create_engine(url)
    with Session(engine) as session:
        job = session.get(Job, seeded["hot_jobs"][-1])
        assert job is not None
        candidates = candidates_of(session, job)
        first = next_trial_number(session, job.id)  # type: ignore[arg-type]
        rows = [
            Trial(job_id=job.id, candidate_id=c.id, number=first + i).model_dump(exclude={"id"})  # type: ignore[arg-type]
            for i, c in enumerate(candidates[i % len(candidates)] for i in range(n))
        ]
        session.exec(insert(Trial), params=rows)
        me = Runner(id="bench-inprocess", name="bench-inprocess")
        session.add(me)
        session.commit()
        body = report_for(
            Trial(id=1, attempt=1, runner_id=me.id, job_id=0, candidate_id=0),
            "2.0.0",
            series(args.samples, leaks=False),
        ).model_dump_json()
        spent: dict[str, float] = defaultdict(float)
        for _ in range(n):
            t0 = time.perf_counter()
            trial = queue.claim(session, me, lease_s=30)
            t1 = time.perf_counter()
            assert trial is not None and trial.id is not None
            queue.heartbeat(session, trial.id, me.id, trial.attempt, lease_s=30)
            t2 = time.perf_counter()
            report = TrialReport.model_validate_json(body)
            report.trial_id = trial.id
            t3 = time.perf_counter()
            trial = queue.lock_for_report(session, trial.id, me.id, trial.attempt)
            job = session.get(Job, trial.job_id)
            candidate = session.get(Candidate, trial.candidate_id)
            assert job is not None and candidate is not None
            record_report(session, job, candidate, trial, report)
            t4 = time.perf_counter()
            queue.touch_runner(session, me.id)
            advance(session, job, slots_for(session, job))
            t5 = time.perf_counter()
            for step, seconds in (
                ("claim", t1 - t0),
                ("heartbeat", t2 - t1),
                ("parse", t3 - t2),
                ("record", t4 - t3),
                ("advance", t5 - t4),
            ):
                spent[step] += 1000 * seconds / n
    engine.dispose()
    spent["total"] = sum(spent.values())
    return dict(spent)


# ------------------------------------------------------------------------------ report


def versions() -> str:
    names = ("fastapi", "uvicorn", "sqlalchemy", "psycopg", "httpx")
    return ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)


def report(path: Path, args: argparse.Namespace, seeded: dict, r: dict, command: str) -> str:
    info = machine()
    lat = r["runner_latency"]
    base, load = r["baseline"], r["under_load"]
    req, db, cost = r["requests"], r["db"], r["breakdown"]
    runner_requests = args.runners * 2 + sum(req.values())  # register + leave per runner
    jobs = len(seeded["hot_jobs"])
    stopped = (
        "every seeded trial was claimed"
        if r["claims"] == args.trials
        else f"stopped by the {args.max_seconds:g} s limit"
    )

    def row(name: str, q: dict[str, float]) -> str:
        cells = [f"{q[k]:.1f}" for k in ("p50", "p95", "p99", "max")]
        return f"| {name} | {q['n']} | {' | '.join(cells)} |"

    claims = (
        f"{r['claims']} / {r['completed']} of {args.trials} seeded, {stopped} "
        f"(database afterwards: {db['done']} done, {db['leased']} leased, {db['queued']} queued)"
    )
    double = (
        f"ids leased twice: {r['duplicates']}; attempt > 1 in the database: "
        f"{db['reattempted']}; runner or attempt not the leaser's: {db['mismatched']}"
    )
    requests = (
        f"{runner_requests} (leases answered 200 / 204: "
        f"{req.get('lease 200', 0)} / {req.get('lease 204', 0)})"
    )
    rate = f"{r['claims_per_s']:.1f}"
    cpu = (
        f"{r['server_cpu_pct']:.0f} % of one core / "
        f"{r['system_cpu_pct']:.0f} % of {info['cpus']} cores"
    )
    steps = ", ".join(
        f"{label} {cost[key]:.1f}"
        for key, label in (
            ("claim", "claim"),
            ("heartbeat", "heartbeat"),
            ("parse", "report JSON validation"),
            ("record", f"lease check, report stored ({args.samples} sample rows), classifier"),
            ("advance", "touch runner + `advance`"),
        )
    )
    serve_workers = f" --workers {args.workers}" if args.workers > 1 else ""
    server_desc = (
        f"{args.workers} uvicorn worker processes" if args.workers > 1 else "one uvicorn process"
    )
    server_what = "processes (serve and workers)" if args.workers > 1 else "process"
    text_ = f"""# API load benchmark (HTTP runners on Postgres)

Written by `bench/api_load.py`: the claim benchmark of `docs/bench-claims.md` again, but through
the real HTTP API. `bisect-cli serve --runners 0{serve_workers}` ({server_desc}, its default
thread pool and database pool) runs against a scratch Postgres database; {args.runners} simulated
runners (threads of a second process, each with its own `runners.client.ApiClient`, retries off)
each register, then lease (`wait=1`), heartbeat once and complete with a {args.samples}-sample
report (a 60 s run at 2 Hz; the runner's default rate is 10 Hz), until the {args.trials}
seeded trials are gone or {args.max_seconds:g} s pass. Meanwhile {args.readers} reader
thread(s) in the benchmark's own process GET one job in a closed loop; the same reader ran
alone for {args.baseline_seconds:g} s first, for the baseline. Server, runners, reader and
Postgres share one machine, so every figure includes the others' CPU use.

Seeding (direct SQL with the service's models, no package index): {jobs} jobs of
{HOT_CANDIDATES} candidates with {args.per_candidate} queued trials per candidate, claimed
job after job as k-section rounds are. Every candidate also holds one trial leased for a day
to a parked runner, which keeps its evaluation open: each `complete` still checks the lease,
stores the report and its samples, runs the classifier and `advance` (job row lock, the job's
candidates and trials loaded, the planner asked), but the planner has nothing new to pick, so
no job finishes and no extra trials appear (checked by calling `advance` on every job before
the run). The watched job has {WATCHED_CANDIDATES} candidates ({WATCHED_REPEATS} repeats),
{seeded["watched_done"]} of its {seeded["watched_trials"]} trials finished with
{seeded["watched_samples"]} samples, 16 candidates judged, 14 running; it does not change
during the run, so its response ({r["response_bytes"]} bytes) is the same with and without
load.

- Machine: {info["summary"]}
- Database: {seeded["postgres"]}, local TCP; {versions()}
- Server: `bisect-cli serve` defaults (lease 30 s, heartbeat 10 s, maintenance every 5 s),
  no tokens
- Code: {info["revision"]}
- Command: `{command}`

| Figure | Value |
| --- | --- |
| Trials claimed / completed through HTTP | {claims} |
| Wall time (first lease to last completion) | {r["elapsed_s"]:.2f} s |
| **Claims per second through HTTP** (lease, heartbeat, complete) | **{rate}** |
| Double claims ({double}) | **{r["double_claims"]}** |
| Runner errors / GET errors | {len(r["errors"])} / {len(r["get_errors"])} |
| Runner requests (register, lease, heartbeat, complete, leave) | {requests} |
| GET /jobs/{{id}} requests (baseline / under load) | {base["n"]} / {load["n"]} |
| Memory samples stored | {db["samples"]} |
| CPU during the load: server {server_what} / whole machine | {cpu} |

Latency in milliseconds, as the client saw it:

| Request | n | p50 | p95 | p99 | max |
| --- | --- | --- | --- | --- | --- |
{row("GET /jobs/{id}, no load (baseline)", base)}
{row(f"**GET /jobs/{{id}}, under {args.runners} runners**", load)}
{row("POST /runners/{id}/lease (200 and 204)", lat.get("lease", quantiles([])))}
{row("POST /trials/{id}/heartbeat", lat.get("heartbeat", quantiles([])))}
{row("POST /trials/{id}/complete", lat.get("complete", quantiles([])))}

Where a claim's server time goes: the same steps called in-process afterwards (one thread,
nothing else running, {args.breakdown_trials} trials of a hot job, same database), mean ms per
trial: {steps}; **{cost["total"]:.1f} ms in all**, so one Python process can serve at most
about {1000 / cost["total"]:.0f} claims per second before HTTP, JSON and thread switching are
counted. The API process runs its handlers in threads of one interpreter (one GIL), so
under load it is bound by one core, whatever the number of runners.
"""
    return write_report(path, text_)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runners", type=int, default=50)
    parser.add_argument("--trials", type=int, default=1000, help="queued trials to seed")
    parser.add_argument("--per-candidate", type=int, default=4, help="queued trials per candidate")
    parser.add_argument("--samples", type=int, default=120, help="samples per report")
    parser.add_argument("--readers", type=int, default=1, help="GET /jobs/{id} reader threads")
    parser.add_argument("--baseline-seconds", type=float, default=10)
    parser.add_argument("--max-seconds", type=float, default=60, help="stop claiming after this")
    parser.add_argument("--breakdown-trials", type=int, default=30)
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "bench-api.md")
    parser.add_argument(
        "--workers", type=int, default=1, help="API worker processes (`serve --workers`)"
    )
    args = parser.parse_args()
    command = (
        f"uv run python bench/api_load.py --runners {args.runners} --trials {args.trials} "
        f"--max-seconds {args.max_seconds:g}"
        + (f" --workers {args.workers}" if args.workers > 1 else "")
    )

    name = f"leakbisect_api_{uuid.uuid4().hex[:12]}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    started = time.monotonic()
    try:
        with reachable_tmpdir(prefix="leakbisect-api-") as tmp:
            upgrade(url)
            seeded = seed(url, args)
            print(f"seeded in {time.monotonic() - started:.1f} s", file=sys.stderr)
            result = run(url, args, seeded, Path(tmp))
            result["breakdown"] = breakdown(url, args, seeded)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    print(report(args.report, args, seeded, result, command))
    print(f"total {time.monotonic() - started:.1f} s", file=sys.stderr)
    for error in result["errors"] + result["get_errors"]:
        print("error:", error, file=sys.stderr)
    if result["errors"]:
        print(result["log"], file=sys.stderr)
    complete = result["claims"] == result["completed"] == result["db"]["done"]
    ok = complete and result["double_claims"] == 0
    return 0 if ok and not result["errors"] and not result["get_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
