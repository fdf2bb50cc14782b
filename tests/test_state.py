"""Typed job state (service/state.py): stored JSON unchanged, the user's options kept."""

import json
from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, text
from sqlmodel import Session, SQLModel

from engine import ddmin
from service.db import alembic_config
from service.models import Job
from service.state import Search, SearchOutcome, StageRecord, StageStatus


def test_a_record_is_stored_with_the_keys_it_was_written_with(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    SQLModel.metadata.create_all(engine)
    with Session(engine) as session:
        job = Job(package="p", good="1", bad="2", script="pass", script_sha256="x")
        job.stages = [StageRecord(stage="mix", status=StageStatus.FOUND, message="m")]
        job.result = SearchOutcome(status=StageStatus.ERROR, message="why")
        session.add(job)
        session.commit()
        stored = session.connection().execute(text("SELECT stages, result FROM job")).one()
        assert json.loads(stored[0]) == [{"stage": "mix", "status": "found", "message": "m"}]
        assert json.loads(stored[1]) == {"status": "error", "message": "why"}
        session.refresh(job)
        assert job.stages[0].status is StageStatus.FOUND and job.stages[0].package is None
        assert job.result == {"status": "error", "message": "why"}  # reads as its JSON
        assert job.target == Search(package="p", good="1", bad="2")


def test_migration_0016_moves_the_search_out_of_the_options_and_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    command.upgrade(alembic_config(url), "0015")
    engine = create_engine(url)
    with engine.begin() as conn:  # a --from/--to job as the mix stage left it before #25
        # Every column that needs a value gets a blank one of its type, then the job's own.
        needed = {
            name: 0 if kind in ("INTEGER", "BOOLEAN", "FLOAT") else ""
            for _, name, kind, notnull, default, _ in conn.execute(text("PRAGMA table_info(job)"))
            if notnull and default is None
        }
        row = {**needed, "id": 1, "package": "culprit", "good": "1.0", "bad": "2.0",
               "from_env": "a==1", "to_env": "a==2", "to_env_name": "bad.txt"}  # fmt: skip
        names = ", ".join(row)
        conn.execute(
            text(f"INSERT INTO job ({names}) VALUES ({', '.join(':' + n for n in row)})"), row
        )
    command.upgrade(alembic_config(url), "0016")
    with engine.connect() as conn:
        row = conn.execute(text("SELECT package, good, bad, search FROM job")).one()
    assert row[:3] == ("", "--from", "bad.txt")
    assert json.loads(row[3]) == {"package": "culprit", "good": "1.0", "bad": "2.0"}
    command.downgrade(alembic_config(url), "0015")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT package, good, bad FROM job")).one() == (
            "culprit", "1.0", "2.0"
        )  # fmt: skip
    engine.dispose()


def test_ddmin_says_when_an_end_is_in_the_wrong_state() -> None:
    changes = [ddmin.Change("a", "1", "2")]
    everything = frozenset({"a"})
    leak, clean = ddmin.Outcome.LEAK, ddmin.Outcome.CLEAN
    wrong = ddmin.step(changes, {frozenset(): leak, everything: leak})
    unjudged = ddmin.step(changes, {frozenset(): ddmin.Outcome.UNRESOLVED, everything: leak})
    assert isinstance(wrong, ddmin.Failed) and wrong.bounds_failed
    assert isinstance(unjudged, ddmin.Failed) and not unjudged.bounds_failed
    assert ddmin.step(changes, {frozenset(): clean, everything: clean}).bounds_failed  # type: ignore[union-attr]
