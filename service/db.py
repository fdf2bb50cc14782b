"""Database engine, sessions and migrations.

A SQLite results database holds every job's script, variables and logs, so nobody but its
owner may read it. Rules:

* leakbisect creates the file itself, mode 0600 (``O_CREAT|O_EXCL|O_NOFOLLOW``), before
  SQLAlchemy's first connection would create it 0644; SQLite gives its ``-wal``, ``-shm``
  and ``-journal`` files the database file's mode, so they are 0600 too.
* Directories it creates for the file are 0700 (only the ones it creates).
* `tighten` (for the default location, which leakbisect made): an existing directory, file
  or companion of ours that group or others can reach is set to 0700 / 0600.
* `exposed` names a file group or others can read; the CLI refuses a database the user chose
  that way (service/cli/db.py) rather than change the mode of a file it did not make.

`upgrade` reads the schema's revision with one query first and imports Alembic (a third of a
second, with Mako and Pygments) only when the database is not at the newest migration: every
`bisect-cli run` upgrades its database, and it almost always is.
"""

import ast
import contextlib
import fcntl
import io
import os
import stat
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool
from sqlmodel import create_engine

if TYPE_CHECKING:
    from collections.abc import Iterator

    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"
# The advisory lock key every migrating process takes on Postgres (migrations/env.py).
MIGRATION_LOCK = 0x6C65616B62697365  # "leakbise"
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
# The files SQLite keeps beside a database (WAL mode: -wal and -shm; rollback: -journal).
COMPANIONS = ("", "-wal", "-shm", "-journal")


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for another database or an in-memory one."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - a URL that does not parse is the driver's to report
        return None
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        return None  # a URI filename: SQLite's to open, with its own options
    return Path(database)


def database_files(path: Path) -> list[Path]:
    """The database file and the companions SQLite keeps beside it."""
    return [path.with_name(path.name + suffix) for suffix in COMPANIONS]


def _make_private_dirs(directory: Path) -> None:
    """Create the missing levels of `directory`, each 0700 (existing ones are left)."""
    missing = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for level in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            level.mkdir(mode=PRIVATE_DIR)


def _create_private(path: Path) -> None:
    """An empty database file, 0600, unless one exists; never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    # An existing database (or a link the user made, which SQLite opens) is left as it is.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, flags, PRIVATE_FILE))


def _tighten_one(path: Path, mode: int) -> None:
    """Set `mode` on `path` if it is ours and wider; a link or another's file is left."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        return
    if stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(st.st_mode) & mode, follow_symlinks=False)


def tighten(url: str) -> None:
    """Make the default database's directory 0700 and its files 0600 (leakbisect made them
    at this location: a database from before this rule was 0644 in a 0755 directory)."""
    path = sqlite_path(url)
    if path is None:
        return
    _tighten_one(path.parent, PRIVATE_DIR)
    for file in database_files(path):
        _tighten_one(file, PRIVATE_FILE)


def exposed(url: str) -> tuple[Path, int] | None:
    """The first file of a SQLite database that group or others may access, and its mode.

    Only where they can reach it: a file open to them inside a directory they cannot enter
    (a 0700 data directory, pytest's own temp root) is as private as a 0600 one, and a
    tool that made the file with the usual umask (0644) should not be refused for it.
    """
    path = sqlite_path(url)
    if path is None or not _reachable_by_others(path):
        return None
    for file in database_files(path):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
        except OSError:
            continue
        if mode & 0o077:
            return file, mode
    return None


def _reachable_by_others(path: Path) -> bool:
    """Whether every directory above `path` lets users other than its owner pass
    (group or other execute bit), following links as the kernel would."""
    for directory in Path(os.path.realpath(path)).parents:
        try:
            if not os.stat(directory).st_mode & 0o011:
                return False
        except OSError:
            return False
    return True


def prepare_sqlite(url: str) -> None:
    """Create a SQLite database's directory (0700) and file (0600) before SQLite would."""
    path = sqlite_path(url)
    if path is None:
        return
    _make_private_dirs(path.parent)
    _create_private(path)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        prepare_sqlite(url)
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


def alembic_config(url: str, migrations: Path = MIGRATIONS) -> "Config":
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _revision_ids(value: ast.expr | None) -> list[str]:
    """The revision ids a migration's `revision`/`down_revision` value names."""
    if value is None:
        return []
    found = ast.literal_eval(value)
    if found is None:
        return []
    if isinstance(found, str):
        return [found]
    if isinstance(found, tuple | list) and all(isinstance(item, str) for item in found):
        return list(found)
    raise ValueError(f"not a revision id: {found!r}")


@lru_cache
def head_revisions(migrations: Path = MIGRATIONS) -> frozenset[str]:
    """The newest migrations (no other revises them), read from the scripts' `revision` and
    `down_revision` assignments without importing them, as Alembic finds its heads."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for script in (migrations / "versions").glob("*.py"):
        assigned: dict[str, ast.expr | None] = {}
        for node in ast.parse(script.read_text(), str(script)).body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                assigned[node.target.id] = node.value
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned[target.id] = node.value
        if "revision" not in assigned or "down_revision" not in assigned:
            raise ValueError(f"{script}: no revision or down_revision")
        revisions.update(_revision_ids(assigned["revision"]))
        revised.update(_revision_ids(assigned["down_revision"]))
    return frozenset(revisions - revised)


def at_head(url: str) -> bool:
    """Whether the database's schema is at the newest migration: its `alembic_version`
    table holds exactly the heads of the migration scripts. False when that cannot be told
    (no such table, no database yet, a script that does not parse): Alembic decides then."""
    if (path := sqlite_path(url)) is not None and not path.exists():
        return False  # a new database: `upgrade` creates it and runs every migration
    try:
        heads = head_revisions()
        # Its own connection, closed after: no pool is left open (`serve` forks after this).
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                stored = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
                return bool(heads) and sorted(stored) == sorted(heads)
        finally:
            engine.dispose()
    except Exception:  # noqa: BLE001 - anything unexpected: let Alembic look (and say)
        return False


def upgrade(url: str) -> None:
    """Bring the schema to the newest migration (idempotent, and safe to run from several
    processes at once: two `bisect-cli run` started together on a new machine).

    A database already there is left as it is without importing Alembic (`at_head`).
    Otherwise one process migrates while the others wait (`_migrating`), then find the
    schema at head and do nothing."""
    prepare_sqlite(url)
    if at_head(url):
        return
    from alembic import command

    with _migrating(url):
        if at_head(url):  # another process migrated it while this one waited
            return
        command.upgrade(alembic_config(url), "head")


@contextlib.contextmanager
def _migrating(url: str) -> "Iterator[None]":
    """Held while migrating. SQLite: an exclusive ``flock`` on the database file itself
    (SQLite's own locks are ``fcntl`` byte ranges, which ``flock`` does not touch on Linux),
    released when the descriptor closes, also when the process dies. Postgres: nothing
    here; migrations/env.py takes a transaction-level advisory lock (`MIGRATION_LOCK`)
    before Alembic reads the schema's revision, so the same holds there."""
    path = sqlite_path(url)
    if path is None or not path.exists():
        yield
        return
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def next_revision_id(migrations: Path = MIGRATIONS) -> str:
    """The next id of the numbered series (0001, 0002, ...): ids sort as they apply."""
    numbers = [int(f.name[:4]) for f in (migrations / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")]
    return f"{max(numbers, default=0) + 1:04d}"


def new_revision(message: str, *, autogenerate: bool, migrations: Path = MIGRATIONS) -> Path:
    """Write a migration after the newest; with `autogenerate`, diffed from the models.

    The diff is taken against a scratch SQLite database at the newest schema, so it holds
    exactly what the models add to the migrations (review it: SQLite types are loose).
    """
    from alembic import command

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
