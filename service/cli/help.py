"""`--help` of bisect-cli's commands: options grouped in panels, readable at 80 columns.

Typer's own rich help lays an option out in six columns (long, short, negative forms, type,
help) that rich narrows evenly: at 80 columns `run --help` had a help column of 17
characters, a word per line, and showed a type (`<bool>`) for flags, which take no value.
`HelpCommand.format_help` prints instead, on stdout, in this order:

1. the usage line, then the command's text with its paragraphs re-flowed to the width;
2. the arguments in "Arguments", then one panel per `rich_help_panel` in the order the
   options first name it (the job options declare theirs once, in service/options.py; the
   options that name none are "Options");
3. a group's commands last, each with its one line ("Commands");
4. in a panel, two columns: the option as it is typed (`option_text`: `--name, -n VALUE`,
   a flag alone, an on/off pair as `--[no-]name`), at most OPTION_COLUMN wide (a longer
   one wraps before its value), and its help with its default, range and environment
   variable after it in one bracket (`details`).
"""

import inspect
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup

OPTION_COLUMN = 24
ARGUMENTS, OPTIONS = "Arguments", "Options"
# A value's placeholder when the option declares no metavar, by the type Typer parses.
TYPE_METAVARS = {"str": "TEXT", "int": "N", "float": "X", "path": "PATH", "Path": "PATH"}


def metavar(param: Any, ctx: Any) -> str:
    """What stands for an option's value: its metavar, its choices, or its type's name."""
    if param.metavar is not None:
        return str(param.metavar)
    shown = str(param.display_type(ctx)).strip("<>")
    if "|" in shown:  # the choices, as they are typed
        return shown
    return TYPE_METAVARS.get(shown.removesuffix(" range"), shown.upper())


def option_text(param: Any, ctx: Any) -> str:
    """An option as it is typed: flags take no value, an on/off pair is `--[no-]name`."""
    if isinstance(param, TyperArgument):
        return str(param.display_name_raw)
    names = ", ".join(param.opts)
    if param.is_flag or param.count:
        off = param.secondary_opts
        if off == ["--no-" + param.opts[0].removeprefix("--")]:
            return "--[no-]" + names.removeprefix("--")
        return "/".join([names, *off])
    return f"{names} {metavar(param, ctx)}"


def _bounds(param: Any) -> str:
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is None and high is None:
        return ""
    if low is None:
        return f"x<={high}"
    return f"x>={low}" if high is None else f"{low}<=x<={high}"


def details(param: Any) -> str:
    """The bracket after an option's help: default, range, environment variable, required."""
    parts = []
    default = getattr(param, "default", None)
    if param.show_default and default not in (None, False, "", [], ()):
        shown = getattr(default, "value", default)  # an Enum member: its value
        if isinstance(default, float):
            shown = f"{default:g}"
        elif default is True:
            shown = "on" if param.secondary_opts else shown
        parts.append(f"default: {shown}")
    if bounds := _bounds(param):
        parts.append(bounds)
    if param.envvar:
        parts.append(f"env: {param.envvar}")
    if param.required:
        parts.append("required")
    return f"[{'; '.join(parts)}]" if parts else ""


def panels(command: Any, ctx: Any) -> dict[str, list[Any]]:
    """Panel title -> its visible parameters: Arguments first, then each panel where its
    first option comes ("Options" for those that name none)."""
    grouped: dict[str, list[Any]] = {ARGUMENTS: []}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if isinstance(param, TyperArgument):
            title = ARGUMENTS
        else:
            title = getattr(param, "rich_help_panel", None) or OPTIONS
        grouped.setdefault(title, []).append(param)
    return {title: params for title, params in grouped.items() if params}


def _panel(title: str, params: list[Any], ctx: Any, width: int) -> Panel:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=width, style="bold cyan", overflow="fold")
    grid.add_column(ratio=1, overflow="fold")
    for param in params:
        help_text = Text(" ".join((param.help or "").split()))
        if extra := details(param):
            help_text.append((" " if help_text else "") + extra, style="dim")
        grid.add_row(Text(option_text(param, ctx)), help_text)
    return Panel(grid, title=title, title_align="left", border_style="dim")


def _commands(group: Any, ctx: Any) -> Panel:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is not None and not command.hidden:
            grid.add_row(name, command.get_short_help_str(limit=300))
    return Panel(grid, title="Commands", title_align="left", border_style="dim")


def print_help(command: Any, ctx: Any, console: Console) -> None:
    """The whole help of `command` (the module docstring's order)."""
    console.print(Padding(Text(command.get_usage(ctx)), (1, 1)), style="bold")
    for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
        if paragraph.strip():
            console.print(Padding(Text(" ".join(paragraph.split())), (0, 1, 1, 1)))
    grouped = panels(command, ctx)
    longest = max(len(option_text(p, ctx)) for params in grouped.values() for p in params)
    width = min(longest, OPTION_COLUMN)
    for title, params in grouped.items():
        console.print(_panel(title, params, ctx, width))
    if hasattr(command, "list_commands"):  # a group: its commands and their one line
        console.print(_commands(command, ctx))
    if command.epilog:
        console.print(Padding(Text(" ".join(command.epilog.split())), (1, 1)))


class HelpCommand(TyperCommand):
    """A Typer command whose --help is `print_help`'s (the root group calls it too)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_help(self, ctx, Console(highlight=False))


class HelpGroup(TyperGroup):
    """A command group (`bisect-cli db`) whose --help is `print_help`'s; its commands are
    declared with `cls=HelpCommand`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_help(self, ctx, Console(highlight=False))
