"""One-line errors with documented exit statuses, never a traceback.

Exit statuses, in one place: 2 bad input (a `LeakbisectError` of kind InvalidInput,
NotFound, Conflict, Unauthenticated, Forbidden or LimitExceeded, a refused request, or a
command this install cannot run: `needs_extra`), 1 internal or unavailable (Unavailable,
a server that cannot be reached, anything unexpected), and the outcome of a
finished job that `run` and `submit --wait` exit with (`OUTCOME_STATUS`: 0 found, 3 bounds
failed, 4 inconclusive). Only the CLI has exit statuses: the API and the page show the
job's status itself, so the mapping lives here, not beside the report's model.
"""

import functools
import os
from typing import NoReturn

import typer

from contract.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    LeakbisectError,
    LimitExceeded,
    NotFound,
    Unauthenticated,
)

BAD_INPUT = 2
INTERNAL = 1

# The default install is the client (submit, status, list, logs, report, cancel); the rest
# needs an extra (pyproject.toml [project.optional-dependencies]): each one's install line.
INSTALL_EXTRA = {
    "server": "uv tool install 'leakbisect[server]'",  # the API, page, database; and runners
    "runner": "uv tool install 'leakbisect[runner]'",
}
OUR_PACKAGES = ("contract", "engine", "runners", "service")

EXIT_STATUS: dict[type[LeakbisectError], int] = {
    InvalidInput: BAD_INPUT,
    NotFound: BAD_INPUT,
    Conflict: BAD_INPUT,
    Forbidden: BAD_INPUT,
    Unauthenticated: BAD_INPUT,
    LimitExceeded: BAD_INPUT,  # TooLarge too: fix the request, or wait
}
# "found" stays 0 for a range that is not monotone: its first transition is a confirmed
# boundary, and the report's first lines (JSON: `not_monotone`) say what else the verdicts show.
# "bounds_failed" (3) is also a range mapped by --all-transitions that has no transition: as with
# a failed bound, the bounds do not bracket a change (its message begins "no transition").
# Keyed by `service.models.JobStatus`'s values (a StrEnum: its members look these up), not its
# members, so that every command need not import the models (tests/test_cli_startup.py checks
# the names).
OUTCOME_STATUS: dict[str, int] = {
    "found": 0,
    "bounds_failed": 3,
    "inconclusive": 4,
    "error": INTERNAL,
    "cancelled": INTERNAL,
}


@functools.cache
def flags() -> dict[str, str]:
    """Field -> the flag a user typed, so messages name what they can fix (derived from the
    job options when a message first needs it: not every command imports them)."""
    from service.options import flag_names

    return flag_names()


def exit_status(exc: LeakbisectError) -> int:
    for kind, code in EXIT_STATUS.items():
        if isinstance(exc, kind):
            return code
    return INTERNAL


def outcome_status(status: str) -> int:
    """The exit status of a job that ended with `status` (1 for one still going)."""
    return OUTCOME_STATUS.get(status, INTERNAL)


def fail(message: str, code: int = BAD_INPUT) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def fail_with(exc: LeakbisectError) -> NoReturn:
    """A leakbisect error as one line, its field shown as the flag the user typed."""
    shown = exc.field and exc.show_field_on_cli
    message = f"{flags().get(exc.field, exc.field)}: {exc}" if shown else str(exc)
    fail(message, exit_status(exc))


def needs_extra(what: str, exc: ModuleNotFoundError, extra: str = "server") -> NoReturn:
    """`what` needs `extra`, which this install lacks (`exc` names the missing package): one
    line naming the extra and how to install it, exit 2. A module of ours missing is a bug,
    raised as it is."""
    missing = (exc.name or "").split(".")[0]
    if not missing or missing in OUR_PACKAGES:
        raise exc
    fail(f"{what} needs the {extra} extra (no {missing} here): {INSTALL_EXTRA[extra]}")


def validation_message(exc: Exception) -> str:
    """The first pydantic error as `--flag: what was wrong`."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    first = errors()[0]
    field = str(first["loc"][0]) if first.get("loc") else "input"
    text = str(first["msg"]).removeprefix("Value error, ")
    return f"{flags().get(field, field)}: {text}"


def internal(exc: BaseException) -> NoReturn:
    """An unexpected failure: one line and exit 1; BISECT_DEBUG=1 re-raises for the traceback."""
    if os.environ.get("BISECT_DEBUG"):
        raise exc
    typer.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
    typer.echo("(set BISECT_DEBUG=1 to see the traceback)", err=True)
    raise SystemExit(INTERNAL)
