"""Nothing around a trial to read (issue 24, row 6): the results database, the spool and
token files are private to their owner, and no secret is taken from a command line.

Each test is an attack a trial (any other uid on the host) could make, or the rule that
stops it: the SQLite database and its companions 0600 under a 0700 directory; an existing
default database tightened; a chosen one open to others refused; a token file open to
others refused; `--token` and a `--database-url` password refused on argv; the runner state
directory 0700 with 0600 entries; `serve --runners 1`'s processes carry no token in argv;
compose keeps the runners away from the database.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import Result
from sqlalchemy import text
from typer.testing import CliRunner

from contract.wire import EnvResult, TrialReport
from runners.agent import Agent
from runners.client import ApiClient
from runners.spool import Spool
from service.cli import app
from service.db import make_engine
from service.settings import get_settings
from tests.test_cli_service import CLI, make_env, read_line

ROOT = Path(__file__).resolve().parents[1]
SECRET_URL = "postgresql+psycopg://leakbisect:hunter2@127.0.0.1:1/leakbisect"
ARGV_TOKEN = (
    "error: --token: a token on the command line is readable by every user "
    "(/proc/PID/cmdline); use --token-file FILE or env BISECT_TOKEN\n"
)
ARGV_PASSWORD = (
    "error: --database-url: a password on the command line is readable by every user "
    "(/proc/PID/cmdline); set env BISECT_DATABASE_URL, or keep the password in "
    "~/.pgpass or PGPASSWORD\n"
)
root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: reads the files as another uid (nobody)"
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """XDG_DATA_HOME for the default database, settings read afresh."""
    home = tmp_path / "xdg"
    home.mkdir()
    home.chmod(0o755)
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.delenv("BISECT_DATABASE_URL", raising=False)
    monkeypatch.delenv("BISECT_DATA_DIR", raising=False)
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


def invoke(*args: str, **env: str) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


# ---------------------------------------------------------------------- the database


def test_a_new_database_and_its_companions_are_0600_under_0700_directories(
    tmp_path: Path,
) -> None:
    db = tmp_path / "new" / "sub" / "r.db"
    done = invoke("db", "upgrade", "--database-url", f"sqlite:///{db}")
    assert done.exit_code == 0, done.stderr
    assert (mode(tmp_path / "new"), mode(db.parent), mode(db)) == (0o700, 0o700, 0o600)
    engine = make_engine(f"sqlite:///{db}")
    with engine.connect() as conn:  # WAL mode: -wal and -shm exist while it is open
        conn.execute(text("CREATE TABLE scratch (x INTEGER)"))
        conn.commit()
        companions = sorted(p.name for p in db.parent.iterdir())
        assert companions == ["r.db", "r.db-shm", "r.db-wal"]
        assert {p.name: mode(p) for p in db.parent.iterdir()} == dict.fromkeys(companions, 0o600)
    engine.dispose()


def test_a_link_in_place_of_a_new_database_is_not_followed_to_create_a_file(
    tmp_path: Path,
) -> None:
    target = tmp_path / "elsewhere.db"
    (tmp_path / "r.db").symlink_to(target)
    from service.db import prepare_sqlite

    prepare_sqlite(f"sqlite:///{tmp_path / 'r.db'}")
    assert not target.exists()


def test_the_default_database_is_created_private(data_home: Path) -> None:
    done = invoke("db", "upgrade", "--json")
    assert done.exit_code == 0, done.stderr
    db = data_home / "leakbisect" / "leakbisect.db"
    assert json.loads(done.stdout)["database_url"] == f"sqlite:///{db}"
    assert (mode(db.parent), mode(db)) == (0o700, 0o600)


def test_an_existing_default_database_open_to_others_is_tightened(data_home: Path) -> None:
    directory = data_home / "leakbisect"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    db = directory / "leakbisect.db"
    assert invoke("db", "upgrade").exit_code == 0
    for path in (db, directory / "leakbisect.db-wal"):  # as leakbisect left them before
        path.touch()
        path.chmod(0o644)
    directory.chmod(0o755)
    listed = invoke("list", "--json")
    assert listed.exit_code == 0, listed.stderr
    assert (mode(directory), mode(db), mode(directory / "leakbisect.db-wal")) == (
        0o700,
        0o600,
        0o600,
    )


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_chosen_database_open_to_others_is_refused_and_left_as_it_is(
    reachable_tmp: Path, how: str
) -> None:
    db = reachable_tmp / "shared.db"  # every directory above it lets others pass
    assert invoke("db", "upgrade", "--database-url", f"sqlite:///{db}").exit_code == 0
    db.chmod(0o644)
    url = f"sqlite:///{db}"
    if how == "flag":
        refused = invoke("list", "--database-url", url)
    else:
        refused = invoke("list", BISECT_DATABASE_URL=url)
    assert refused.exit_code == 2
    assert refused.stderr == (
        f"error: --database-url: {db} is mode 0644: other users can read every job's "
        f"script and logs; run chmod 600 {db}\n"
    )
    assert refused.stdout == ""
    assert mode(db) == 0o644


def test_a_chosen_database_others_cannot_reach_is_taken_as_it_is(tmp_path: Path) -> None:
    # 0644 (what the usual umask gives) inside a directory others cannot enter: private.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    db = private / "mine.db"
    assert invoke("db", "upgrade", "--database-url", f"sqlite:///{db}").exit_code == 0
    db.chmod(0o644)
    listed = invoke("list", "--database-url", f"sqlite:///{db}")
    assert (listed.exit_code, listed.stderr) == (0, "")
    assert mode(db) == 0o644


@pytest.mark.parametrize(
    "argv",
    [
        ["db", "upgrade"],
        ["serve", "--runners", "0"],
        ["list"],
        ["report", "1", "--local"],
        ["run", "x.py", "-p", "pkg", "--range", "1..2"],
    ],
    ids=lambda a: a[0],
)
def test_a_database_password_on_the_command_line_is_refused(argv: list[str]) -> None:
    refused = invoke(*argv, "--database-url", SECRET_URL)
    assert refused.exit_code == 2
    assert refused.stderr == ARGV_PASSWORD
    assert refused.stdout == ""


def test_a_database_password_from_the_environment_is_taken() -> None:
    # Taken: it reaches the driver (nothing listens on port 1) and is never printed.
    tried = invoke("db", "upgrade", BISECT_DATABASE_URL=SECRET_URL)
    assert tried.exit_code == 2
    assert tried.stderr.startswith(
        "error: --database-url: cannot upgrade "
        "postgresql+psycopg://leakbisect:***@127.0.0.1:1/leakbisect: "
    )
    assert "hunter2" not in tried.stderr


# ---------------------------------------------------------------------- tokens


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "x.py"],
        ["status", "1"],
        ["list"],
        ["cancel", "1"],
        ["logs", "1", "1"],
        ["report", "1"],
    ],
    ids=lambda a: a[0],
)
def test_a_client_token_on_the_command_line_is_refused(argv: list[str]) -> None:
    refused = invoke(*argv, "--token", "alice-secret", "--server", "http://127.0.0.1:1")
    assert refused.exit_code == 2
    assert refused.stderr == ARGV_TOKEN
    assert refused.stdout == ""


def token_file(tmp_path: Path, file_mode: int) -> Path:
    path = tmp_path / "token"
    path.write_text("alice-secret\n")
    path.chmod(file_mode)
    return path


@pytest.mark.parametrize("file_mode", [0o644, 0o640, 0o604, 0o660], ids=oct)
@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["runner", "--token-file", "{F}"], {}),
        (["runner"], {"BISECT_RUNNER_TOKEN_FILE": "{F}"}),
        (["status", "1", "--token-file", "{F}"], {}),
        (["submit", "x.py"], {"BISECT_TOKEN_FILE": "{F}"}),
    ],
    ids=["runner-flag", "runner-env", "client-flag", "client-env"],
)
def test_a_token_file_open_to_others_is_refused(
    tmp_path: Path, file_mode: int, argv: list[str], env: dict[str, str]
) -> None:
    path = token_file(tmp_path, file_mode)
    args = [a.replace("{F}", str(path)) for a in argv]
    refused = invoke(*args, "--server", "http://127.0.0.1:1", **{k: str(path) for k in env})
    assert refused.exit_code == 2
    assert refused.stderr == (
        f"error: --token-file: {path} is mode {file_mode:04o}, open to other users; a token "
        f"file must be private to its owner: run chmod 600 {path}\n"
    )
    assert mode(path) == file_mode


def test_a_token_file_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    refused = invoke("runner", "--token-file", str(fifo), "--server", "http://127.0.0.1:1")
    assert refused.exit_code == 2
    assert refused.stderr == f"error: --token-file: {fifo} is not a regular file\n"


def test_a_private_client_token_file_is_the_token_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    def fake_client(server: str, token: str | None, **_: Any) -> ApiClient:
        seen.append(token)
        raise SystemExit(0)

    monkeypatch.setattr("service.cli.jobs.make_client", fake_client)
    path = token_file(tmp_path, 0o600)
    assert invoke("cancel", "1", "--token-file", str(path)).exit_code == 0
    assert invoke("cancel", "1", BISECT_TOKEN="from-env").exit_code == 0
    assert seen == ["alice-secret", "from-env"]


# ---------------------------------------------------------------------- the spool


def test_the_runner_state_directory_is_0700_and_its_entries_0600(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    state = tmp_path / "state" / "runner"
    agent = Agent(ApiClient("http://127.0.0.1:1"), "r", {}, None, None, state_dir=state)  # type: ignore[arg-type]
    report = TrialReport(trial_id=7, attempt=1, env=EnvResult(ok=True))
    entry = agent.spool.put(report, "runner-1", "runner-secret")
    assert entry.path is not None
    assert (mode(tmp_path / "state"), mode(state), mode(entry.path.parent), mode(entry.path)) == (
        0o700,
        0o700,
        0o700,
        0o600,
    )


def spooled(trial_id: int = 7) -> TrialReport:
    return TrialReport(trial_id=trial_id, attempt=1, env=EnvResult(ok=True))


def test_the_spool_writes_no_entry_through_a_planted_link(tmp_path: Path) -> None:
    """Today's spool wrote the runner secret through a link at its temporary name."""
    spool = Spool(tmp_path)
    (tmp_path / "spool").mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for name in ("trial-7-a1.json", ".trial-7-a1.json.tmp"):
        os.symlink(victim, tmp_path / "spool" / name)
    entry = spool.put(spooled(), "runner-1", "runner-secret")
    assert victim.read_text() == "keep"
    assert entry.path is not None and not entry.path.is_symlink()
    assert mode(entry.path) == 0o600
    assert [e.trial_id for e in spool.pending()[0]] == [7]


def test_the_spool_chmods_no_link_in_place_of_its_directory(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    target.chmod(0o755)
    (tmp_path / "state").mkdir()
    os.symlink(target, tmp_path / "state" / "spool")
    with pytest.raises(OSError, match="spool"):
        Spool(tmp_path / "state").put(spooled(), "runner-1", "runner-secret")
    assert mode(target) == 0o755
    assert list(target.iterdir()) == []


def test_a_planted_fifo_or_link_entry_is_set_aside_without_hanging(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(spooled(1), "runner-1", "runner-secret")
    os.mkfifo(tmp_path / "spool" / "trial-2-a1.json")
    os.symlink("/etc/shadow", tmp_path / "spool" / "trial-3-a1.json")
    entries, bad = spool.pending()
    assert [e.trial_id for e in entries] == [1]
    assert bad == ["trial-2-a1.json", "trial-3-a1.json"]
    assert Path("/etc/shadow").exists()  # the link was renamed, not what it points at


# ---------------------------------------------------------------------- serve


@root_only
def test_a_trial_user_reads_nothing_serve_keeps_and_no_argv_holds_a_token(
    reachable_tmp: Path, uv_cache: Path
) -> None:
    """`serve --runners 1` as root with tokens: another uid (a trial's) cannot open the
    database it made in the default location, and neither serve nor any process it started
    has a token on its command line."""
    tokens = {"BISECT_API_TOKENS": "alice:alice-tok-5e1f", "BISECT_RUNNER_TOKENS": "r:run-tok-9a2c"}
    env = {**make_env(reachable_tmp, reachable_tmp / "cache", uv_cache), **tokens}
    log = reachable_tmp / "serve.log"
    with log.open("w") as err:
        serve = subprocess.Popen(
            [*CLI, "serve", "--port", "0", "--runners", "1", "--json"],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
    try:
        assert serve.stdout is not None
        assert read_line(serve.stdout, 60), log.read_text()
        db = reachable_tmp / "data" / "leakbisect" / "leakbisect.db"
        probe = (
            "import json, sys\nout = {}\nfor p in sys.argv[1:]:\n"
            "    try:\n        open(p, 'rb').read(16); out[p] = 'read'\n"
            "    except OSError as e:\n        out[p] = e.strerror\nprint(json.dumps(out))\n"
        )
        files = [str(db), f"{db}-wal", str(db.parent / "runners" / "1")]
        seen = subprocess.run(
            ["/usr/bin/python3", "-c", probe, *files],
            capture_output=True, text=True, user=65534, group=65534, extra_groups=[], cwd="/",
            timeout=30,
        )  # fmt: skip
        assert json.loads(seen.stdout) == dict.fromkeys(files, "Permission denied"), seen.stderr
        procs = [psutil.Process(serve.pid), *psutil.Process(serve.pid).children(recursive=True)]
        for proc in procs:
            try:
                argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):  # a child that ended meanwhile
                assert proc.pid != serve.pid
                continue
            assert b"tok-" not in argv, argv
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)


# ---------------------------------------------------------------------- compose


def compose_block(start: str, end: str) -> str:
    """The text of compose.yaml from the line `start` to the line `end`."""
    text = (ROOT / "compose.yaml").read_text()
    return text.split(f"\n{start}\n", 1)[1].split(f"\n{end}", 1)[0]


def test_compose_keeps_the_runners_away_from_the_database() -> None:
    runner = compose_block("x-runner: &runner", "services:")
    for secret in ("BISECT_DATABASE_URL", "POSTGRES_PASSWORD", "BISECT_API_TOKENS",
                   "BISECT_RUNNER_TOKENS", "pgdata"):  # fmt: skip
        assert secret not in runner, secret
    assert "BISECT_RUNNER_TOKEN:" in runner
    api = compose_block("  api:", "  runner: *runner")
    assert "docker.sock" not in api and "BISECT_DATABASE_URL" in api
    assert "--token" not in (ROOT / "compose.yaml").read_text()
