"""Shared fixtures: the offline fixture index, a uv cache kept for the whole session, and
directories the trial and build users can reach."""

import fcntl
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# A machine that sets PYTHONDONTWRITEBYTECODE (this one does, in its environment) has every
# Python process compile each module it imports from source. The suite starts about 2,700 of
# them over the same sources (the CLI, servers, runners, benchmarks), so here Python keeps
# its bytecode cache as it does by default: `import service.cli.run` takes 0.87 s of CPU
# against 1.55 s, and the machine's CPU over a whole run fell from 1302 to 1154 s
# (docs/bench-suite.md is the run after). Set before the workers start, so they and every
# process they start inherit it; processes of the trial and build users cannot write to
# these trees and compile as before. (Set here, the imports below are cached too.)
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from sqlalchemy import Engine, create_engine, text  # noqa: E402
from sqlalchemy.exc import OperationalError  # noqa: E402

from service.example.fixture import build_fixture  # noqa: E402
from service.example.index import serve_index  # noqa: E402
from tests.schedule import CONTAINER_MODULES  # noqa: E402


@pytest.fixture(scope="session")
def fixture_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("fixture-wheels"))


@pytest.fixture(scope="session")
def fixture_index(fixture_wheels: Path) -> Iterator[str]:
    with serve_index(fixture_wheels) as url:
        yield url


@pytest.fixture(scope="session")
def reachable_root() -> Iterator[Path]:
    """A directory every user can enter (mode 0755 under /tmp), removed after the session.

    pytest's own temporary directories (/tmp/pytest-of-root/..., mode 0700) cannot be
    entered by the trial and build users the runner drops to when it runs as root, so
    environment roots, uv caches and other paths those users must reach live here.
    """
    root = Path(tempfile.mkdtemp(prefix="leakbisect-tests-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def reachable_dir(reachable_root: Path) -> Callable[[str], Path]:
    """``reachable_dir("name")``: a new empty 0755 directory under `reachable_root`."""

    def make(name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=reachable_root))
        path.chmod(0o755)
        return path

    return make


@pytest.fixture
def reachable_tmp(reachable_dir: Callable[[str], Path], request: pytest.FixtureRequest) -> Path:
    """Like `tmp_path`, but reachable by the trial and build users."""
    return reachable_dir(request.node.name[:40].replace("/", "-"))


@pytest.fixture(scope="session")
def uv_cache(reachable_dir: Callable[[str], Path]) -> Path:
    """One uv cache for the session, like a runner's; tests never touch the user's."""
    return reachable_dir("uv-cache")


@pytest.fixture
def without_orphan_reaper(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that itself starts a process as a trial or build user. Once any test in
    this worker has run a trial, the runner's backstop thread (runners.sandbox
    `reap_orphans`) kills and reaps every direct child running as such a user, taking it
    for a dead supervisor's orphan, and the test's `Popen.wait` then reads exit 0 (ECHILD)."""
    from runners import sandbox

    monkeypatch.setattr(sandbox, "reap_orphans", lambda uids: 0)


@pytest.fixture
def trial_dir() -> Iterator[Path]:
    """A private working directory as `execute_trial` makes one: 0700, owned by the trial
    user when the tests run as root; removed after the test."""
    from runners.sandbox import private_dir
    from runners.users import identities

    with private_dir(identities().trial, "leakbisect-test-trial-") as work:
        yield work


@pytest.fixture(scope="session")
def trial_python() -> str:
    """An interpreter the trial user can run (as root, not pyenv's under /root)."""
    from runners.envs import find_python

    return find_python(None)


PG_ADMIN_URL = os.environ.get(
    "BISECT_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # One source for the `postgres` marker:
        # every test that uses a Postgres database, directly or as the "postgres" parameter
        # of a database fixture (those reach pg_url through getfixturevalue).
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if "pg_url" in getattr(item, "fixturenames", ()) or "postgres" in params:
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="module", autouse=True)
def _containers_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-xdist (pyproject's addopts: four workers, `--dist loadfile`, so a module's
    tests and its module-scoped fixtures stay on one worker) the modules that start
    containers take turns: an inter-process lock held for the whole module."""
    if request.module.__name__.rsplit(".", 1)[-1] not in CONTAINER_MODULES:
        yield
        return
    with open(Path(tempfile.gettempdir()) / "leakbisect-tests-docker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _postgres_admin() -> Engine:
    """The admin engine; outside CI an unreachable server skips, in CI it fails the run."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        admin.connect().close()
    except OperationalError as exc:
        admin.dispose()
        why = f"no Postgres at {PG_ADMIN_URL} ({str(exc.orig).strip().splitlines()[0]})"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: .ci/run starts it; a skipped Postgres test fails CI")
        pytest.skip(f"{why}: start it (README, Development) or set BISECT_TEST_PG")
    return admin


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh Postgres database for one test module, dropped afterwards."""
    name = f"leakbisect_test_{uuid.uuid4().hex[:12]}"
    admin = _postgres_admin()
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
