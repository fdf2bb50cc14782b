"""Outside text is shown without its control sequences (issue 7: logs and reports)."""

import io

import pytest
from rich.console import Console

from service.cli.display import render_report
from service.schemas import Report
from service.text import printable


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred\x1b[0m", "red"),
        ("a\x1b]0;pwned title\x07b", "ab"),
        ("x\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\y", "xlinky"),
        ("bell\x07 nul\x00 del\x7f c1\x85", "bell nul del c1"),
        ("bar 10%\rbar 20%\r\n", "bar 10%\nbar 20%\n"),
        ("\x9b2Jclear", "clear"),
        ("\x1bPdevice control\x1b\\after", "after"),
        ("\x1b7saved\x1b8", "saved"),
        ("tab\tok\nline\n", "tab\tok\nline\n"),
        ("ünïcödé ✓", "ünïcödé ✓"),
    ],
)
def test_printable_drops_escapes_and_controls(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_the_report_shows_outside_text_as_text() -> None:
    report = Report(
        job_id=1,
        status="error",
        package="leakyfixture",
        range="1.0.0..1.0.9",
        message="good bound failed: [bold red]no[/] \x1b[2Jcleared",
    )
    plain = io.StringIO()
    render_report(Console(file=plain, width=200, no_color=True), report, {})
    assert "good bound failed: [bold red]no[/] cleared" in plain.getvalue()  # not obeyed
    terminal = io.StringIO()
    render_report(Console(file=terminal, width=200, force_terminal=True), report, {})
    assert "\x1b[2J" not in terminal.getvalue()
