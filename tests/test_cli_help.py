"""`--help` of every command at 80 columns; run, submit, serve and runner in detail.

Each command's help is read from a real `bisect-cli CMD --help` with COLUMNS=80: no line is
wider than 80, no flag shows a value placeholder (`<bool>`), the panels are the expected ones
in their order, every visible option of the command is listed (an on/off pair as
`--[no-]name`) in the panel it declares, and the help column starts where the option column
(at most 24 wide) ends.
"""

import functools
import os
import re
import subprocess
import sys

import click
import pytest

from service.cli import load_command

CLI = [sys.executable, "-m", "service.cli"]
PANELS = {
    "run": ["Arguments", "What to bisect", "Environment", "Runs and verdicts", "Stages",
            "Output", "Executor", "Options"],
    "submit": ["Arguments", "What to bisect", "Environment", "Runs and verdicts", "Stages",
               "Output", "Options"],
    "serve": ["Options", "Output", "Executor"],
    "runner": ["Options", "Executor"],
}  # fmt: skip
TITLE = re.compile(r"╭─ (.+?) ─+╮")


@functools.cache
def help_text(command: str) -> str:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    proc = subprocess.run(
        [*CLI, *command.split(), "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def panel_blocks(text: str) -> dict[str, str]:
    """Panel title -> the text inside its box."""
    blocks: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        if match := TITLE.match(line):
            title = match.group(1)
            blocks[title] = ""
        elif line.startswith("╰"):
            title = None
        elif title is not None:
            blocks[title] += line + "\n"
    return blocks


def shown_as(opt: str) -> list[str]:
    """How an option may be written in the help: as itself, or in an on/off pair."""
    name = opt.removeprefix("--").removeprefix("no-")
    return [opt, f"--[no-]{name}"] if opt.startswith("--") else [opt]


@pytest.mark.parametrize("command", list(PANELS))
def test_help_fits_80_columns_in_its_panels_with_every_option(command: str) -> None:
    text = help_text(command)
    assert [len(line) for line in text.splitlines() if len(line) > 80] == []
    assert "<bool>" not in text and "<str>" not in text
    blocks = panel_blocks(text)
    assert list(blocks) == PANELS[command]
    cmd = load_command(command)
    params = [p for p in cmd.get_params(click.Context(cmd)) if not getattr(p, "hidden", False)]
    assert len(params) > 5
    for param in params:
        panel = getattr(param, "rich_help_panel", None) or (
            "Arguments" if param.param_type_name == "argument" else "Options"
        )
        for opt in [*param.opts, *param.secondary_opts]:
            assert any(
                re.search(rf"(^|[\s,]){re.escape(form)}(\s|,|$)", blocks[panel], re.M)
                for form in shown_as(opt)
            ), f"{opt} is not in the {panel} panel of {command} --help"


def test_flags_take_no_value_and_the_help_column_starts_after_24() -> None:
    """A flag is alone in its column; the help starts at column 27 (the border, a space,
    24 of option column, a space), whatever the longest option."""
    lines = help_text("run").splitlines()

    def row(start: str) -> str:
        return next(line for line in lines if line.startswith(f"│ {start} "))

    assert row("--pre").index("Include pre-releases in the range.") == 27
    assert row("--[no-]reuse").index("Reuse verdicts") == 27
    assert row("--json").index("Print one JSON object on stdout.") == 27
    assert row("--repeats N").index("Runs per candidate. [default: 1; 1<=x<=20]") == 27
    assert row("--min-growth-fraction F").index("Growth as a fraction") == 27
    # A typed value too long for the column wraps before the value, not into the help.
    executor = lines.index(row("--executor"))
    assert lines[executor + 1].startswith("│ local|docker|slurm ")


@pytest.mark.parametrize(
    "command",
    ["ci", "status", "list", "logs", "report", "cancel", "db", "db upgrade", "db revision"],
)
def test_every_other_command_fits_80_columns_with_no_placeholder_for_a_flag(
    command: str,
) -> None:
    text = help_text(command)
    assert [len(line) for line in text.splitlines() if len(line) > 80] == []
    assert re.findall(r"<[a-z]+>", text) == []
    assert "Options" in panel_blocks(text)


def test_the_root_help_lists_every_command_without_a_bool() -> None:
    from service.cli import COMMANDS

    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    proc = subprocess.run([*CLI, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if len(line) > 80] == []
    assert "<bool>" not in proc.stdout
    assert list(panel_blocks(proc.stdout)) == ["Options", "Commands"]
    rows = panel_blocks(proc.stdout)["Commands"].splitlines()
    assert [row.split()[1] for row in rows if row[2] != " "] == list(COMMANDS)
