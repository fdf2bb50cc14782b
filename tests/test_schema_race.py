"""Concurrent first runs create the schema once (issue 28: two `bisect-cli run` started at
once on a new machine, or a CI matrix sharing a home, failed with "table job already
exists"). Several real processes upgrade one new database at the same moment, on SQLite
and on Postgres; every one succeeds and the schema is at the newest migration."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from service.db import head_revisions

PROCESSES = 6
UPGRADER = """
import sys, time
from pathlib import Path
from service.db import upgrade
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
upgrade(sys.argv[1])
"""


def upgrade_at_once(url: str, tmp_path: Path) -> list[subprocess.CompletedProcess[str]]:
    """`PROCESSES` processes, each imported and waiting, all released by one file."""
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", UPGRADER, url, str(go)], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(PROCESSES)
    ]  # fmt: skip
    time.sleep(3)  # every interpreter started and waiting on the file
    go.touch()
    done = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def at_head(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            stored = sorted(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert {"job", "trial", "candidate"} <= tables
    return stored


def test_concurrent_first_upgrades_of_a_sqlite_database_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'results.db'}"
    done = upgrade_at_once(url, tmp_path)
    assert [p.returncode for p in done] == [0] * PROCESSES, [p.stderr[-800:] for p in done]
    assert at_head(url) == sorted(head_revisions())


@pytest.mark.postgres
def test_concurrent_first_upgrades_of_a_postgres_database_all_succeed(
    pg_url: str, tmp_path: Path
) -> None:
    done = upgrade_at_once(pg_url, tmp_path)
    assert [p.returncode for p in done] == [0] * PROCESSES, [p.stderr[-800:] for p in done]
    assert at_head(pg_url) == sorted(head_revisions())
