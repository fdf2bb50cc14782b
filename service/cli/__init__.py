"""The `bisect-cli` command line: one module per command group."""

import typer

from contract.errors import LeakbisectError
from service.cli import db, jobs
from service.cli.errors import exit_status, internal
from service.cli.run import run
from service.cli.runner import runner
from service.cli.serve import serve
from service.cli.submit import submit

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    # A failure is one line (internal()), never a traceback; BISECT_DEBUG=1 shows it.
    pretty_exceptions_enable=False,
    help="Find the first release of a dependency that leaks memory.",
)
app.command(name="run")(run)
app.command(name="serve")(serve)
app.command(name="runner")(runner)
app.command(name="submit")(submit)
app.command(name="status")(jobs.status)
app.command(name="list")(jobs.list_jobs)
app.command(name="cancel")(jobs.cancel)
app.command(name="logs")(jobs.logs)
app.command(name="report")(jobs.report)
app.add_typer(db.app, name="db")


@app.callback()
def root() -> None:
    """Find the first release of a dependency that leaks memory."""


def main() -> None:
    try:
        app()
    except LeakbisectError as exc:  # raised before a command could say it (bad BISECT_* settings)
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(exit_status(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the last line of defence against a traceback
        internal(exc)
