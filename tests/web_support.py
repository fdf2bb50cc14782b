"""What the status page tests share: a real `serve` process, a database holding a real
bisection of the bundled example, and rows for every job state.

Not a test module (no `test_` prefix): tests/test_web*.py import it.
"""

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert
from sqlmodel import Session

from service.db import get_engine, upgrade
from service.models import (
    Candidate,
    Job,
    JobStatus,
    MemorySample,
    Trial,
    TrialStatus,
    utcnow,
)
from service.store import next_trial_number
from tests.test_cli_service import Service, make_env

REPO = Path(__file__).resolve().parents[1]
REPRO = REPO / "service" / "example" / "repro.py"
CLI = [sys.executable, "-m", "service.cli"]
HOSTILE_LOG = "step 1\n<script>alert(1)</script>\n\x1b[31mred\x1b[0m done\n"
HOSTILE_REQ = '"><img src=x onerror=alert(1)>'


def run_example(db: Path, env: dict[str, str]) -> dict[str, Any]:
    """`bisect-cli run --example` into `db`: a real found job (first bad 1.0.6)."""
    proc = subprocess.run(
        CLI + ["run", "--example", "--database-url", f"sqlite:///{db}", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@contextmanager
def serving(
    home: Path, env: dict[str, str], database_url: str, *args: str, **extra: str
) -> Iterator[Service]:
    """`bisect-cli serve --port 0` on `database_url` until the block ends."""
    svc = Service(home, env)
    svc.start_serve(database_url, *args, **extra)
    try:
        yield svc
    finally:
        svc.stop()


def copy_db(source: Path, dest: Path) -> str:
    shutil.copyfile(source, dest)
    return f"sqlite:///{dest}"


def add_job(
    url: str,
    status: JobStatus,
    *,
    versions: tuple[str, ...] = ("1.0", "1.1", "1.2", "1.3"),
    verdicts: dict[str, str] | None = None,
    result: dict[str, Any] | None = None,
    message: str | None = None,
    owner: str | None = None,
    package: str = "demo-pkg",
    requirements: list[str] | None = None,
    leased: str | None = None,
    log_tail: str | None = None,
    find_fix: bool = False,
    stored: dict[str, Any] | None = None,
) -> int:
    """A job in `status` with candidates `versions` (verdicts by version), one done trial per
    judged candidate (with `log_tail`), one leased trial of `leased`; returns its id.
    `stored`: more of the job's fields as the scheduler stores them (`dependency`, `commit`)."""
    upgrade(url)
    verdicts = verdicts or {}
    script = "print('hello')\n"
    with Session(get_engine(url)) as session:
        job = Job(
            package=package,
            script=script,
            script_sha256=hashlib.sha256(script.encode()).hexdigest(),
            good=versions[0],
            bad=versions[-1],
            status=status.value,
            result=result,
            message=message,
            owner=owner,
            find_fix=find_fix,
            requirements=requirements or [],
            finished_at=utcnow() if status.finished else None,
            **(stored or {}),
        )
        session.add(job)
        session.flush()
        for i, version in enumerate(versions):
            verdict = verdicts.get(version)
            candidate = Candidate(
                job_id=job.id,
                position=i,
                version=version,
                verdict=verdict,
                evaluations=[verdict] if verdict else [],
                growth_mib=40.0 if verdict == "leak" else 0.0 if verdict else None,
                testable=verdict != "untestable",
                untestable_reason="no wheel" if verdict == "untestable" else None,
            )
            if verdict == "untestable":
                candidate.verdict = None
                candidate.evaluations = []
            session.add(candidate)
            session.flush()
            if candidate.verdict:
                analysis = {
                    "verdict": verdict,
                    "reason": f"{verdict} by the numbers",
                    "growth_mib": candidate.growth_mib,
                    "host": {
                        "verdict": verdict,
                        "unit": "MiB/s",
                        "growth_mib": candidate.growth_mib,
                        "slope": 0.5,
                        "slope_low": 0.4,
                        "slope_high": 0.6,
                        "baseline_mib": 10.0,
                        "floors_mib": [10.0, 11.0],
                        "floor_x": [1.0, 2.0],
                        "window": 8.0,
                    },
                }
                now = utcnow()
                session.add(
                    Trial(
                        job_id=job.id,
                        number=next_trial_number(session, job.id),
                        candidate_id=candidate.id,
                        status=TrialStatus.DONE,
                        attempt=1,
                        runner_id="runner-x",
                        started_at=now - timedelta(seconds=3),
                        finished_at=now,
                        exit_code=0,
                        duration_s=3.0,
                        verdict=verdict,
                        analysis=analysis,
                        log_tail=log_tail,
                    )
                )
            if version == leased:
                session.add(
                    Trial(
                        job_id=job.id,
                        number=next_trial_number(session, job.id),
                        candidate_id=candidate.id,
                        status=TrialStatus.LEASED,
                        attempt=1,
                        runner_id="runner-y",
                        started_at=utcnow(),
                        rss=123 * 1024 * 1024,
                    )
                )
        session.commit()
        assert job.id is not None
        return job.id


def add_samples(url: str, trial_id: int, rows: list[dict[str, Any]]) -> None:
    with Session(get_engine(url)) as session:
        session.execute(insert(MemorySample), [{"trial_id": trial_id, **r} for r in rows])
        session.commit()


def service_env(home: Path, reachable_dir: Any, uv_cache: Path, **extra: str) -> dict[str, str]:
    return make_env(home, reachable_dir("web-cache"), uv_cache, **extra)


_EXAMPLE: dict[str, Any] = {}


def example_db(root: Path, env: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    """One real bisection of the example per test process (about 25 s), shared read-only."""
    if "db" not in _EXAMPLE:
        db = root / "example.db"
        _EXAMPLE["report"] = run_example(db, env)
        _EXAMPLE["db"] = db
    return _EXAMPLE["db"], _EXAMPLE["report"]
