"""What the API accepts in a job that `bisect-cli run` would: the submission policy.

A client names the job's requirements and indexes, and the API server reads indexes to
list releases, so a submission must not make the server build, read its own files, or
reach into its own network (docs/security.md):

- requirements are index requirements only: a direct reference (``pkg @ URL``, VCS, a
  local path) is refused; `bisect-cli run`, where the user runs their own code, takes them;
- ``find_links`` and the index URLs are http or https URLs with a host;
- indexes are read under `fetch_policy`: with tokens configured, only the hosts in
  BISECT_ALLOWED_INDEXES, or any host with public addresses when that is unset; with no
  tokens (loopback only) any host; always with bounded redirects and a byte cap;
- ``python`` is a minor version CPython has had or may soon have (3.8 to 3.20).

Each refusal is an `InvalidInput` naming the field (422).
"""

from urllib.parse import urlsplit

from packaging.requirements import Requirement

from contract.errors import InvalidInput
from service.index import FetchPolicy
from service.options import PYTHON_MINORS, PYTHON_VERSION
from service.schemas import JobCreate
from service.settings import Settings


def fetch_policy(settings: Settings) -> FetchPolicy:
    hosts = tuple(settings.allowed_indexes) or None
    return FetchPolicy(
        local_paths=False,
        allowed_hosts=hosts,
        public_only=hosts is None and settings.auth_enabled,
        max_bytes=settings.index_max_bytes,
    )


def _url(value: str, field: str) -> None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidInput(f"{value!r} is not a URL: {exc}", field=field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{value!r} is not an http(s) URL with a host", field=field)


def check_submission(request: JobCreate) -> None:
    """Refuse what the API server must not act on; `InvalidInput` names the field."""
    for text in request.requirements:
        if Requirement(text).url is not None:
            raise InvalidInput(
                f"{text!r} is a direct reference; the API takes index requirements only "
                "(use --index-url/--extra-index-url, or `bisect-cli run` for local code)",
                field="requirements",
            )
    if request.index_url is not None:
        _url(request.index_url, "index_url")
    for url in request.extra_index_urls:
        _url(url, "extra_index_urls")
    for url in request.find_links:
        _url(url, "find_links")
    if request.repo is not None:
        # Runners clone it: a URL, never a path on a runner's disk.
        if not request.repo.startswith(("https://", "http://")):
            raise InvalidInput(
                f"{request.repo!r}: the API takes an http(s) URL of the repository "
                "(a local clone's path is for `bisect-cli run` only)",
                field="repo",
            )
        _url(request.repo, "repo")
    if request.python is not None:
        match = PYTHON_VERSION.fullmatch(request.python)
        if match is None or int(match["minor"]) not in PYTHON_MINORS:
            raise InvalidInput(
                f"{request.python!r}: no CPython 3.{match['minor'] if match else '?'}; "
                f"write 3.{PYTHON_MINORS.start} to 3.{PYTHON_MINORS.stop - 1}",
                field="python",
            )
