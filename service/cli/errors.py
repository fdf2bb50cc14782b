"""One-line errors with documented exit statuses, never a traceback."""

import os
from typing import NoReturn

import typer

BAD_INPUT = 2
INTERNAL = 1

# JobCreate field -> the flag a user typed, so messages name what they can fix.
FLAGS = {
    "package": "--package",
    "range": "--range",
    "script": "SCRIPT",
    "python": "--python",
    "requirements": "--with/-r",
    "index_url": "--index-url",
    "extra_index_urls": "--extra-index-url",
    "find_links": "--find-links",
    "repeats": "--repeats",
    "max_runs": "--max-runs",
    "timeout_s": "--timeout",
    "memory_limit": "--memory-limit",
    "sample_hz": "--sample-hz",
    "min_growth_mib": "--min-growth",
    "min_growth_fraction": "--min-growth-fraction",
}


def fail(message: str, code: int = BAD_INPUT) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def validation_message(exc: Exception) -> str:
    """The first pydantic error as `--flag: what was wrong`."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    first = errors()[0]
    field = str(first["loc"][0]) if first.get("loc") else "input"
    text = str(first["msg"]).removeprefix("Value error, ")
    return f"{FLAGS.get(field, field)}: {text}"


def internal(exc: BaseException) -> NoReturn:
    """An unexpected failure: one line and exit 1; BISECT_DEBUG=1 re-raises for the traceback."""
    if os.environ.get("BISECT_DEBUG"):
        raise exc
    typer.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
    typer.echo("(set BISECT_DEBUG=1 to see the traceback)", err=True)
    raise SystemExit(INTERNAL)
