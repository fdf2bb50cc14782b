"""What the commands that talk to a server share: --server/--token, the client, errors.

Server and token come from the flags, else the environment:

* ``BISECT_SERVER``: the server's base URL (default ``http://127.0.0.1:8000``,
  where ``bisect-cli serve`` listens); ``/api/v1`` is added when missing.
* ``--token-file FILE`` / ``BISECT_TOKEN_FILE``, else ``BISECT_TOKEN``: an API token (one
  of the server's ``BISECT_API_TOKENS``) for submit, status, list, cancel, logs and report.
* ``BISECT_RUNNER_TOKEN_FILE`` or ``BISECT_RUNNER_TOKEN``: a runner token (one of
  ``BISECT_RUNNER_TOKENS``) for ``bisect-cli runner``, from a file or the environment
  (service/cli/runner.py).

No token is ever taken from a command line: every user of the machine, and any trial a
runner beside it runs, reads argv in /proc/PID/cmdline. ``--token`` is refused in one line
(exit 2). A token file must be a regular file private to its owner (no group or other
bits): one that is not is refused in one line naming the file, its mode and the fix
(``chmod 600 FILE``), exit 2, before anything is sent.
* ``BISECT_HTTP_RETRIES``: how often a network error or 5xx is retried
  (default 5, backoff 0.5 s doubling: about 15 s in all before giving up).

Errors are one line on stderr: ``error: HTTP 4xx: <the server's detail>``
with exit status 2 (the request was refused: fix the input or the token);
``error: cannot reach URL: ...`` or a 5xx after every retry with status 1.
"""

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from runners.client import ApiClient, ApiError, ApiUnreachable
from service.cli.errors import BAD_INPUT, INTERNAL, fail

DEFAULT_SERVER = "http://127.0.0.1:8000"
DEFAULT_RETRIES = 5

Server = Annotated[
    str,
    typer.Option(
        "--server",
        envvar="BISECT_SERVER",
        help="The leakbisect server's URL (env BISECT_SERVER).",
        show_default=True,
    ),
]
TOKEN_ENV = "BISECT_TOKEN"
TOKEN_FILE_MAX = 4096  # a token is a line; a longer file is not a token file


def read_token_file(flag: str, path: Path) -> str:
    """The token in `path`: a regular file with no group or other bits, the token alone on
    one line. Anything else fails in one line (exit 2). Opened non-blocking (a FIFO does not
    hang) and read bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        fail(f"{flag}: cannot read {path}: {exc.strerror or exc}")
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            fail(f"{flag}: {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            fail(
                f"{flag}: {path} is mode {mode:04o}, open to other users; a token file must "
                f"be private to its owner: run chmod 600 {path}"
            )
        data = fh.read(TOKEN_FILE_MAX + 1)
    try:
        token = data.decode().strip()
    except UnicodeDecodeError:
        token = ""
    if not token or "\n" in token or len(data) > TOKEN_FILE_MAX:
        fail(f"{flag}: {path} must hold the token alone, on one line")
    return token


def _client_token(value: str | None) -> str | None:
    """The API token: from --token-file / BISECT_TOKEN_FILE, else env BISECT_TOKEN."""
    if value is None:
        return os.environ.get(TOKEN_ENV) or None
    return read_token_file("--token-file", Path(value))


def _refuse_argv_token(value: str | None) -> None:
    if value is not None:
        fail(
            "--token: a token on the command line is readable by every user "
            "(/proc/PID/cmdline); use --token-file FILE or env BISECT_TOKEN"
        )


# The API token, read by the option's callback: commands get the token, not the file name.
Token = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        envvar="BISECT_TOKEN_FILE",
        metavar="FILE",
        callback=_client_token,
        help="File holding the API token, one of the server's BISECT_API_TOKENS, mode 0600 "
        "(env BISECT_TOKEN_FILE); else the token is read from env BISECT_TOKEN. Never on the "
        "command line: argv is readable by every user.",
        show_default=False,
    ),
]
# Refused: kept only to say why instead of "no such option".
ArgvToken = Annotated[
    str | None,
    typer.Option("--token", hidden=True, callback=_refuse_argv_token, show_default=False),
]


def http_retries() -> int:
    text = os.environ.get("BISECT_HTTP_RETRIES", "").strip()
    if not text:
        return DEFAULT_RETRIES
    if not text.isdigit():
        fail(f"BISECT_HTTP_RETRIES: {text!r} is not a whole number")
    return int(text)


def make_client(
    server: str, token: str | None, on_retry: Callable[[str], None] | None = None
) -> ApiClient:
    if not server.strip():
        fail("--server: empty; give the server's URL, e.g. http://127.0.0.1:8000")
    return ApiClient(server, token or None, retries=http_retries(), on_retry=on_retry)


@contextmanager
def api_errors() -> Iterator[None]:
    """Turn the client's errors into one line and an exit status."""
    try:
        yield
    except ApiError as exc:
        fail(str(exc), BAD_INPUT if 400 <= exc.status < 500 else INTERNAL)
    except ApiUnreachable as exc:
        fail(str(exc), INTERNAL)
