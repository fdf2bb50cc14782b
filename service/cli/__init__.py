"""The `bisect-cli` command line: one module per command group.

A command's module is imported only when that command runs or shows its own help
(`LazyGroup`): `bisect-cli run` does not import the web server `serve` needs, and
`bisect-cli --help` imports no command at all. `COMMANDS` names each command's module and
the one line `bisect-cli --help` shows for it; tests/test_cli_startup.py checks that line
against the command's own help. `--help` lists every command on every install; a command
that needs an extra the install lacks (`EXTRA`) says so in one line when it is loaded
(service/cli/errors.py `needs_extra`, exit 2).
"""

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from contract.errors import LeakbisectError
from service.cli.errors import exit_status, internal, needs_extra

# name -> (module, attribute: a command function or a Typer group, its one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": (
        "service.cli.run", "run",
        "Bisect a release range locally and report the first leaking release.",
    ),
    "serve": (
        "service.cli.serve", "serve",
        "Run the leakbisect API, plus N local runners so one command gives a working service.",
    ),
    "runner": ("service.cli.runner", "runner", "Run trials for a leakbisect server until stopped."),
    "submit": (
        "service.cli.submit", "submit",
        "Submit a bisection to a leakbisect server and print the job's page URL.",
    ),
    "ci": (
        "service.cli.ci", "ci",
        "Bisect from CI in one step: submit, wait, job summary, outputs, one PR comment.",
    ),
    "status": (
        "service.cli.jobs", "status",
        "Show a job: status, progress, candidates with verdicts and, once found, the result.",
    ),
    "list": ("service.cli.jobs", "list_jobs", "List jobs, newest first."),
    "cancel": (
        "service.cli.jobs", "cancel",
        "Cancel a job: queued trials are dropped, running ones killed by their runners.",
    ),
    "logs": (
        "service.cli.jobs", "logs",
        "Print a trial's log tail (the end of the script's output) after a summary line.",
    ),
    "report": (
        "service.cli.jobs", "report",
        "Print a job's report: the text report, --json, or --markdown to paste upstream.",
    ),
    "db": ("service.cli.db", "app", "Manage the results database."),
}  # fmt: skip


# The commands beyond the client (the default install), and the extra each needs.
EXTRA: dict[str, str] = {"run": "server", "serve": "server", "runner": "runner", "db": "server"}


class _Listed(TyperCommand):
    """What `bisect-cli --help` lists for a command whose module is not imported yet."""


def load_command(name: str) -> TyperCommand | TyperGroup:
    """The command `name`, built from its module (imported here)."""
    from service.cli.help import HelpCommand

    module, attribute, _ = COMMANDS[name]
    try:
        target = getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError as exc:
        if name not in EXTRA:
            raise
        needs_extra(f"bisect-cli {name}", exc, EXTRA[name])
    if not isinstance(target, typer.Typer):
        single = typer.Typer(add_completion=False)
        single.command(name=name, cls=HelpCommand)(target)  # --help in panels (help.py)
        target = single
    command = typer.main.get_command(target)
    assert isinstance(command, TyperCommand | TyperGroup)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """The root group: its help lists `COMMANDS` by their line; a command's module is
    imported when the command is resolved (to run it or print its own help)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, (_, _, short_help) in COMMANDS.items():
            self.commands.setdefault(name, _Listed(name=name, short_help=short_help))
        self._listing = False

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if isinstance(command, _Listed) and not self._listing:
            command = self.commands[cmd_name] = load_command(cmd_name)
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from rich.console import Console

        from service.cli.help import print_help

        self._listing = True  # the help only lists the commands: none is imported for it
        try:
            print_help(self, ctx, Console(highlight=False))  # as each command's (help.py)
        finally:
            self._listing = False


app = typer.Typer(
    cls=LazyGroup,
    no_args_is_help=True,
    add_completion=False,
    # A failure is one line (internal()), never a traceback; BISECT_DEBUG=1 shows it.
    pretty_exceptions_enable=False,
    help="Find the first release of a dependency that leaks memory.",
)


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
