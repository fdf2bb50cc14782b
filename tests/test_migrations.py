"""The migrations build exactly the schema the SQLModel tables describe, on SQLite and Postgres.

Alembic's autogenerate comparison of the migrated database against `SQLModel.metadata`
must find nothing to do: a model change without its migration fails here.
"""

import json
import shutil
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from sqlmodel import SQLModel
from typer.testing import CliRunner

import service.models  # noqa: F401  (registers the tables)
from service.cli import app
from service.db import MIGRATIONS, next_revision_id, upgrade


def drift(url: str) -> list:
    upgrade(url)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(context, SQLModel.metadata)
    finally:
        engine.dispose()


def test_sqlite_schema_matches_the_models(tmp_path: Path) -> None:
    assert drift(f"sqlite:///{tmp_path / 'db.sqlite'}") == []


@pytest.mark.postgres
def test_postgres_schema_matches_the_models(pg_url: str) -> None:
    assert drift(pg_url) == []


def test_db_revision_writes_the_next_numbered_migration(tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    expected = next_revision_id(migrations)
    result = CliRunner().invoke(
        app,
        ["db", "revision", "-m", "add a column", "--autogenerate", "--json",
         "--migrations", str(migrations)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    path = migrations / "versions" / f"{expected}_add_a_column.py"
    assert out == {"path": str(path), "revision": expected}
    text = path.read_text()
    newest = max(f.name[:4] for f in (MIGRATIONS / "versions").glob("[0-9]*_*.py"))
    assert f"revision: str = '{expected}'" in text
    assert f"down_revision: str | None = '{newest}'" in text
    # The models and the migrations agree (the drift test's claim), so nothing was generated.
    assert text.count("    pass\n") == 2


def test_db_revision_refuses_an_empty_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["db", "revision", "-m", "  "])
    assert result.exit_code == 2
    assert result.output == "error: --message: empty; say what the migration does\n"
