"""The migrations build exactly the schema the SQLModel tables describe, on SQLite and Postgres.

Alembic's autogenerate comparison of the migrated database against `SQLModel.metadata`
must find nothing to do: a model change without its migration fails here.
"""

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import service.models  # noqa: F401  (registers the tables)
from service.db import upgrade


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
