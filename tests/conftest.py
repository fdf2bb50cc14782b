"""Shared fixtures: the offline fixture index and a uv cache kept for the whole session."""

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from service.example.fixture import build_fixture
from service.example.index import serve_index


@pytest.fixture(scope="session")
def fixture_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("fixture-wheels"))


@pytest.fixture(scope="session")
def fixture_index(fixture_wheels: Path) -> Iterator[str]:
    with serve_index(fixture_wheels) as url:
        yield url


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uv cache for the session, like a runner's; tests never touch the user's."""
    return tmp_path_factory.mktemp("uv-cache")


PG_ADMIN_URL = os.environ.get(
    "BISECT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh Postgres database for one test module, dropped afterwards."""
    name = f"leakbisect_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        from service.db import get_engine

        get_engine.cache_clear()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
