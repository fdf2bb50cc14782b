"""Database engine, sessions and migrations."""

import contextlib
import io
import tempfile
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import create_engine

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"


def _ensure_sqlite_dir(url: str) -> None:
    path = url.split("///", 1)[-1]
    if url.startswith("sqlite") and path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        _ensure_sqlite_dir(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            # WAL lets the status page read while a runner writes samples.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


@lru_cache
def get_engine(url: str) -> Engine:
    return make_engine(url)


def alembic_config(url: str, migrations: Path = MIGRATIONS) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    _ensure_sqlite_dir(url)
    command.upgrade(alembic_config(url), "head")



def next_revision_id(migrations: Path = MIGRATIONS) -> str:
    """The next id of the numbered series (0001, 0002, ...): ids sort as they apply."""
    numbers = [int(f.name[:4]) for f in (migrations / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")]
    return f"{max(numbers, default=0) + 1:04d}"


def new_revision(message: str, *, autogenerate: bool, migrations: Path = MIGRATIONS) -> Path:
    """Write a migration after the newest; with `autogenerate`, diffed from the models.

    The diff is taken against a scratch SQLite database at the newest schema, so it holds
    exactly what the models add to the migrations (review it: SQLite types are loose).
    """
    with tempfile.TemporaryDirectory(prefix="leakbisect-revision-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'head.db'}"
        cfg = alembic_config(url, migrations)
        # Alembic prints its progress on stdout; the command prints the path (or JSON).
        with contextlib.redirect_stdout(io.StringIO()):
            if autogenerate:
                command.upgrade(cfg, "head")
            script = command.revision(
                cfg, message=message, autogenerate=autogenerate, rev_id=next_revision_id(migrations)
            )
    assert script is not None and not isinstance(script, list)
    return Path(script.path)
