"""`bisect-cli` imports what the invoked command needs, and no more.

Behaviour, not time (bench/cli_startup.py measures the time): which modules a fresh
interpreter holds after the CLI is built, after `run --help`, and after a `run` on a
database at the newest schema; and that skipping Alembic there never skips a migration.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from service.cli import COMMANDS, load_command
from service.cli.errors import OUTCOME_STATUS
from service.db import alembic_config, at_head, head_revisions, upgrade
from service.models import JobStatus

# Never for `--help`, `run --help` or a local `run`: the web stack (`serve`), the migration
# tool (only for a database not at the newest schema).
WEB_AND_MIGRATIONS = ("fastapi", "starlette", "uvicorn", "jinja2", "alembic", "mako")


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    """The top-level modules a fresh interpreter holds after running `code`."""
    probe = (
        "import json, sys\n"
        "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.__stderr__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    last = proc.stderr.strip().splitlines()[-1]
    return set(json.loads(last))


def _top(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_building_the_cli_imports_no_command() -> None:
    modules = _modules_after("import service.cli, typer\ntyper.main.get_command(service.cli.app)")
    heavy = ("sqlalchemy", "sqlmodel", "numpy", "httpx", "pygments", *WEB_AND_MIGRATIONS)
    assert not _top(modules) & set(heavy)
    assert not {m for m in modules if m.startswith("service.") and m != "service.cli"} - {
        "service.cli.errors"
    }


def test_root_help_imports_no_command() -> None:
    code = "import sys\nsys.argv = ['bisect-cli', '--help']\nimport service.cli\nservice.cli.main()"
    modules = _modules_after(code)
    assert not _top(modules) & {"sqlalchemy", "sqlmodel", "numpy", "httpx", *WEB_AND_MIGRATIONS}
    assert "service.cli.run" not in modules and "service.cli.serve" not in modules


def test_run_help_imports_neither_the_web_stack_nor_the_models() -> None:
    code = (
        "import sys\nsys.argv = ['bisect-cli', 'run', '--help']\n"
        "import service.cli\nservice.cli.main()"
    )
    modules = _modules_after(code)
    assert not _top(modules) & {"httpx", *WEB_AND_MIGRATIONS}
    for name in ("service.models", "service.local", "service.jobs", "service.cli.serve"):
        assert name not in modules, name
    assert not {m for m in modules if m.startswith(("service.app", "service.web", "service.api"))}


def test_run_on_a_database_at_head_imports_no_web_stack_and_no_alembic(tmp_path: Path) -> None:
    """A real `run` up to its first failure (the index is a closed port): it opens and
    checks the database, prepares the executor and asks for the releases."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    upgrade(url)
    script = tmp_path / "repro.py"
    script.write_text("print('hi')\n")
    argv = [
        "bisect-cli", "run", str(script), "-p", "leakyfixture", "--range", "1.0.0..1.0.1",
        "--index-url", "http://127.0.0.1:9/simple", "--database-url", url, "--json",
    ]  # fmt: skip
    code = f"import sys\nsys.argv = {argv!r}\nimport service.cli\nservice.cli.main()"
    modules = _modules_after(code, {"BISECT_DATA_DIR": str(tmp_path / "data")})
    assert "service.jobs" in modules  # it got as far as creating the job
    assert not _top(modules) & set(WEB_AND_MIGRATIONS)


def test_a_new_database_is_migrated_by_run(tmp_path: Path) -> None:
    from service.cli import app  # noqa: F401 - the CLI as the user starts it

    url = f"sqlite:///{tmp_path / 'new' / 'results.db'}"
    script = tmp_path / "repro.py"
    script.write_text("print('hi')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "run", str(script), "-p", "leakyfixture",
         "--range", "1.0.0..1.0.1", "--index-url", "http://127.0.0.1:9/simple",
         "--database-url", url, "--json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "BISECT_DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach index" in proc.stderr
    assert at_head(url)


def test_an_old_database_is_migrated_and_one_at_head_is_recognised(tmp_path: Path) -> None:
    from alembic import command

    url = f"sqlite:///{tmp_path / 'old.db'}"
    assert not at_head(url)  # no file yet
    command.upgrade(alembic_config(url), "0010")
    assert not at_head(url)
    upgrade(url)
    assert at_head(url)
    upgrade(url)  # idempotent, and quick
    assert at_head(url)


def test_head_revisions_are_alembics() -> None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert head_revisions() == frozenset(script.get_heads())


def test_the_listed_help_is_each_commands_own() -> None:
    for name, (_, _, short_help) in COMMANDS.items():
        command = load_command(name)
        first = (command.help or "").split("\n\n")[0].replace("\n", " ")
        assert short_help == first, name


def test_outcome_statuses_name_job_statuses() -> None:
    assert set(OUTCOME_STATUS) <= {status.value for status in JobStatus}
    assert {status.value for status in JobStatus if status.finished} == set(OUTCOME_STATUS)
