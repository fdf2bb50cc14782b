"""The `bisect-cli` command line: one module per command group."""

import typer

from service.cli.run import run

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Find the first release of a dependency that leaks memory.",
)
app.command(name="run")(run)


@app.callback()
def root() -> None:
    """Find the first release of a dependency that leaks memory."""


def main() -> None:
    app()
