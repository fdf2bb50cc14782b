"""What the commands that talk to a server share: --server/--token, the client, errors.

Server and token come from the flags, else the environment:

* ``BISECT_SERVER``: the server's base URL (default ``http://127.0.0.1:8000``,
  where ``bisect-cli serve`` listens); ``/api/v1`` is added when missing.
* ``BISECT_TOKEN``: an API token (one of the server's ``BISECT_API_TOKENS``)
  for submit, status, list, cancel and logs.
* ``BISECT_RUNNER_TOKEN_FILE`` or ``BISECT_RUNNER_TOKEN``: a runner token (one of
  ``BISECT_RUNNER_TOKENS``) for ``bisect-cli runner``, from a file or the environment,
  never from its command line (service/cli/runner.py).
* ``BISECT_HTTP_RETRIES``: how often a network error or 5xx is retried
  (default 5, backoff 0.5 s doubling: about 15 s in all before giving up).

Errors are one line on stderr: ``error: HTTP 4xx: <the server's detail>``
with exit status 2 (the request was refused: fix the input or the token);
``error: cannot reach URL: ...`` or a 5xx after every retry with status 1.
"""

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="BISECT_TOKEN",
        help="API token, one of the server's BISECT_API_TOKENS (env BISECT_TOKEN).",
        show_default=False,
    ),
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
