"""What the API accepts in a job that `bisect-cli run` would: the submission policy.

A client names the job's requirements and indexes, and the API server reads indexes to
list releases, so a submission must not make the server build, read its own files, or
reach into its own network (docs/security.md):

- requirements are index requirements only: a direct reference (``pkg @ URL``, VCS, a
  local path) is refused; `bisect-cli run`, where the user runs their own code, takes them;
- ``find_links``, the index URLs and ``repo`` are http or https URLs with a host, under
  the job's outbound rule (`reach`, contract/outbound.py), checked here and again by every
  request the server makes and by the runner before git or uv starts: with tokens
  configured, only the hosts in BISECT_ALLOWED_INDEXES, or any host with public addresses
  when that is unset; with no tokens (loopback only) any host written plainly; indexes are
  read with bounded redirects and a byte cap (`fetch_policy`);
- ``python`` is a minor version CPython has had or may soon have (3.8 to 3.20).

Each refusal is an `InvalidInput` naming the field (422).
"""

from urllib.parse import urlsplit

from packaging.requirements import Requirement

from contract import outbound
from contract.errors import InvalidInput
from contract.outbound import Reach
from service.index import FetchPolicy
from service.options import PYTHON_MINORS, PYTHON_VERSION
from service.schemas import JobCreate
from service.settings import Settings


def reach(settings: Settings) -> Reach | None:
    """What an API job's URLs may reach: the hosts listed, else public ones with tokens
    configured; None (anything) for a tokenless service, which serves loopback only."""
    if settings.allowed_indexes:
        return Reach(hosts=tuple(settings.allowed_indexes))
    return Reach() if settings.auth_enabled else None


def fetch_policy(settings: Settings) -> FetchPolicy:
    return FetchPolicy(
        local_paths=False, reach=reach(settings), max_bytes=settings.index_max_bytes
    )


def _url(value: str, field: str, what: str, rule: Reach | None) -> None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidInput(f"{value!r} is not a URL: {exc}", field=field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{value!r} is not an http(s) URL with a host", field=field)
    try:
        outbound.check(value, rule)
    except outbound.Refused as exc:
        raise InvalidInput(outbound.describe(what, value, exc), field=field) from None


def check_submission(request: JobCreate, rule: Reach | None = None) -> None:
    """Refuse what the API server must not act on; `InvalidInput` names the field. `rule`:
    where the job's URLs may lead (`reach`; None: any host written plainly)."""
    for text in request.requirements:
        if Requirement(text).url is not None:
            raise InvalidInput(
                f"{text!r} is a direct reference; the API takes index requirements only "
                "(use --index-url/--extra-index-url, or `bisect-cli run` for local code)",
                field="requirements",
            )
    if request.index_url is not None:
        _url(request.index_url, "index_url", "index", rule)
    for url in request.extra_index_urls:
        _url(url, "extra_index_urls", "index", rule)
    for url in request.find_links:
        _url(url, "find_links", "find-links", rule)
    if request.repo is not None:
        # Runners clone it: a URL, never a path on a runner's disk.
        if not request.repo.startswith(("https://", "http://")):
            raise InvalidInput(
                f"{request.repo!r}: the API takes an http(s) URL of the repository "
                "(a local clone's path is for `bisect-cli run` only)",
                field="repo",
            )
        _url(request.repo, "repo", "repository", rule)
    if request.python is not None:
        match = PYTHON_VERSION.fullmatch(request.python)
        if match is None or int(match["minor"]) not in PYTHON_MINORS:
            raise InvalidInput(
                f"{request.python!r}: no CPython 3.{match['minor'] if match else '?'}; "
                f"write 3.{PYTHON_MINORS.start} to 3.{PYTHON_MINORS.stop - 1}",
                field="python",
            )
