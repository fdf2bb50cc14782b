"""`bisect-cli db upgrade | revision`: the results database's schema (Alembic migrations).

`results_database` is how every command that opens the results database finds it: the
default SQLite file (BISECT_DATA_DIR) is leakbisect's own, so its directory is made 0700
and its files 0600 (service/db.py `tighten`); a SQLite file the user named
(--database-url, BISECT_DATABASE_URL) that group or others can read, in directories they
can pass through, is refused in one line
with the fix (exit 2): leakbisect does not change the mode of a file it was pointed at.
"""

import json
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy.engine import make_url

from service.cli.errors import fail
from service.cli.help import HelpCommand, HelpGroup
from service.cli.options import DatabaseUrl, Json
from service.db import MIGRATIONS, exposed, new_revision, tighten
from service.db import upgrade as upgrade_schema
from service.settings import get_settings

app = typer.Typer(
    cls=HelpGroup,  # --help in panels, as every command's (help.py)
    no_args_is_help=True,
    add_completion=False,
    help="Manage the results database.",
)


def shown(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a URL that does not parse is shown as given
        return url


def results_database(given: str | None) -> str:
    """The results database's URL: `given` (--database-url or BISECT_DATABASE_URL), else
    the default SQLite file, tightened; a chosen SQLite file others can read fails here."""
    settings = get_settings()
    if not given and not settings.database_url:
        url = settings.effective_database_url
        tighten(url)
        return url
    url = given or settings.effective_database_url
    if (found := exposed(url)) is not None:
        path, mode = found
        fail(
            f"--database-url: {path} is mode {mode:04o}: other users can read every job's "
            f"script and logs; run chmod 600 {path}"
        )
    return url


@app.command(cls=HelpCommand)
def upgrade(database_url: DatabaseUrl = None, json_: Json = False) -> None:
    """Apply every pending migration (idempotent; `serve` does it at start too).

    Exit status: 0 done, 2 the database cannot be opened.
    """
    url = results_database(database_url)
    try:
        upgrade_schema(url)
    except Exception as exc:  # noqa: BLE001 - any driver error is one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"--database-url: cannot upgrade {shown(url)}: {first}")
    if json_:
        typer.echo(json.dumps({"database_url": shown(url), "upgraded": True}))
    else:
        typer.echo(f"database {shown(url)} is at the newest schema")


@app.command(cls=HelpCommand)
def revision(
    message: Annotated[
        str, typer.Option("--message", "-m", help="What the migration does (its file name).")
    ],
    autogenerate: Annotated[
        bool,
        typer.Option(
            "--autogenerate",
            help="Fill it with the difference between the models (service/models.py) and the "
            "newest schema; review it before committing.",
        ),
    ] = False,
    migrations: Annotated[
        Path,
        typer.Option(
            "--migrations",
            file_okay=False,
            exists=True,
            help="The Alembic script directory (default: this project's migrations/).",
        ),
    ] = MIGRATIONS,
    json_: Json = False,
) -> None:
    """Write a new migration after the newest, numbered in sequence (for developers).

    Exit status: 0 written, 2 bad input (an empty message, no such directory).
    """
    if not message.strip():
        fail("--message: empty; say what the migration does")
    path = new_revision(message.strip(), autogenerate=autogenerate, migrations=migrations)
    if json_:
        typer.echo(json.dumps({"path": str(path), "revision": path.name[:4]}))
    else:
        typer.echo(f"wrote {path}")
