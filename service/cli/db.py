"""`bisect-cli db upgrade`: bring a database to the newest schema (Alembic)."""

import json

import typer
from sqlalchemy.engine import make_url

from service.cli.errors import fail
from service.cli.options import DatabaseUrl, Json
from service.db import upgrade as upgrade_schema
from service.settings import get_settings

app = typer.Typer(
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


@app.command()
def upgrade(database_url: DatabaseUrl = None, json_: Json = False) -> None:
    """Apply every pending migration (idempotent; `serve` does it at start too).

    Exit status: 0 done, 2 the database cannot be opened.
    """
    url = database_url or get_settings().effective_database_url
    try:
        upgrade_schema(url)
    except Exception as exc:  # noqa: BLE001 - any driver error is one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"--database-url: cannot upgrade {shown(url)}: {first}")
    if json_:
        typer.echo(json.dumps({"database_url": shown(url), "upgraded": True}))
    else:
        typer.echo(f"database {shown(url)} is at the newest schema")
