"""List a package's releases from package indexes and find-links locations.

`list_releases` asks each index for `{index}/{normalized-name}/`, preferring PEP 691
JSON and falling back to PEP 503 HTML, and merges what the indexes and the find-links
locations (local directories or files, or flat HTML pages) hold into `Release` objects
(`engine.releases`). `target_tags` gives the Python version and wheel tags that
`engine.releases.installability` checks a release against.

Errors are `IndexUnavailable`, with a one-line message for the user.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import httpx
from packaging import tags as ptags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from contract import outbound
from contract.errors import InvalidInput
from engine.releases import DistFile, Release

PYPI_SIMPLE = "https://pypi.org/simple"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT_PREFER_JSON = f"{JSON_TYPE}, text/html;q=0.1"
ACCEPT = {
    None: ACCEPT_PREFER_JSON,
    "json": JSON_TYPE,
    "html": "application/vnd.pypi.simple.v1+html, text/html;q=0.1",
}
DEFAULT_TIMEOUT = 30.0
_How = tuple[str, float, int]  # Accept header, timeout, byte cap


class IndexRefused(Exception):
    """Raised inside the HTTP client when a URL breaks the fetch policy (never escapes)."""


class IndexUnavailable(InvalidInput):
    """An index could not be read, or does not know the package. One-line message.

    The message names the index or find-links location itself, so the CLI shows it
    without a flag (with several indexes a single flag could be the wrong one).
    """

    show_field_on_cli = False

    def __init__(self, message: str) -> None:
        super().__init__(message, field="index_url")


def _ssl_verify() -> ssl.SSLContext | bool:
    """Verify with SSL_CERT_FILE / SSL_CERT_DIR when set (corporate proxies, containers)."""
    cafile = os.environ.get("SSL_CERT_FILE")
    capath = os.environ.get("SSL_CERT_DIR")
    if cafile and Path(cafile).is_file():
        return ssl.create_default_context(cafile=cafile)
    if capath and Path(capath).is_dir():
        return ssl.create_default_context(capath=capath)
    return True


def _describe(exc: httpx.HTTPError, timeout: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out after {timeout:g} s"
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "connection refused" in low:
        return "connection refused"
    if "name or service not known" in low or "nodename nor servname" in low:
        return "host not found"
    if "certificate verify failed" in low:
        return "TLS certificate verify failed (set SSL_CERT_FILE to your CA bundle)"
    return re.sub(r"^\[Errno -?\d+\]\s*", "", text.splitlines()[0])


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def file_identity(filename: str) -> tuple[str, Version] | None:
    """(normalized project name, version) of a wheel or sdist filename, else None."""
    try:
        if filename.endswith(".whl"):
            name, version, _build, _tags = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            name, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return canonicalize_name(name), version


def _parse_json(body: dict, base_url: str) -> list[DistFile]:
    out = []
    for f in body.get("files", []):
        yanked = f.get("yanked", False)
        out.append(
            DistFile(
                filename=f["filename"],
                url=urldefrag(urljoin(base_url, f["url"])).url,
                requires_python=f.get("requires-python") or None,
                yanked=(yanked if isinstance(yanked, str) else "") if yanked else None,
                upload_time=_parse_time(f.get("upload-time")),
                sha256=(f.get("hashes") or {}).get("sha256"),
            )
        )
    return out


class _LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.links: list[tuple[str, dict[str, str | None], str]] = []
        self._open: tuple[str, dict[str, str | None]] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")
        elif tag == "a":
            a = dict(attrs)
            if a.get("href"):
                self._open = (a["href"] or "", a)
                self._text = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.links.append((*self._open, "".join(self._text).strip()))
            self._open = None


def _parse_html(text: str, base_url: str) -> list[DistFile]:
    parser = _LinkParser()
    parser.feed(text)
    parser.close()
    base = urljoin(base_url, parser.base) if parser.base else base_url
    out = []
    for href, attrs, _text in parser.links:
        url, fragment = urldefrag(urljoin(base, href))
        filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        sha256 = None
        if fragment.startswith("sha256="):
            sha256 = fragment.removeprefix("sha256=")
        out.append(
            DistFile(
                filename=filename,
                url=url,
                requires_python=attrs.get("data-requires-python") or None,
                yanked=(attrs["data-yanked"] or "") if "data-yanked" in attrs else None,
                upload_time=None,
                sha256=sha256,
            )
        )
    return out


@dataclass(frozen=True)
class FetchPolicy:
    """How far a listing may reach. `LOCAL` for `bisect-cli run`; the API builds a strict
    one from its settings (`service.policy.fetch_policy`), since there a client names the
    URLs.

    - ``local_paths``: find-links directories and ``file://`` locations are read.
    - ``reach``: the outbound rule (`contract.outbound`: the hosts listed in
      BISECT_ALLOWED_INDEXES, else public addresses only; None: any host). Checked before
      each request, every redirect hop included; a name that changes its answer between
      the check and the connection is the one gap left (docs/security.md).
    - ``max_redirects`` and ``max_bytes`` bound every page fetched.
    """

    local_paths: bool = True
    reach: outbound.Reach | None = None
    max_redirects: int = 5
    max_bytes: int = 64 * 1024 * 1024


LOCAL = FetchPolicy()


@dataclass(frozen=True)
class _Page:
    status_code: int
    url: str
    content_type: str
    body: bytes


def _host_allowed(url: httpx.URL, policy: FetchPolicy) -> str | None:
    """Why `url` may not be fetched under `policy`, or None when it may."""
    if url.scheme not in ("http", "https"):
        return f"only http and https indexes can be read, not {url.scheme}://"
    try:
        outbound.check(str(url), policy.reach)
    except outbound.Refused as exc:
        return str(exc)
    return None


def _client(timeout: float, policy: FetchPolicy) -> httpx.Client:
    def check(request: httpx.Request) -> None:
        reason = _host_allowed(request.url, policy)
        if reason is not None:
            raise IndexRefused(reason)

    return httpx.Client(
        timeout=timeout,
        follow_redirects=True,
        max_redirects=policy.max_redirects,
        verify=_ssl_verify(),
        trust_env=True,
        event_hooks={"request": [check]},
    )


def _fetch_page(
    client: httpx.Client, url: str, what: str, accept: str, timeout: float, max_bytes: int
) -> _Page:
    try:
        with client.stream("GET", url, headers={"Accept": accept}) as response:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise IndexUnavailable(f"{what} sent more than {max_bytes >> 20} MiB")
            ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
            return _Page(response.status_code, str(response.url), ctype, bytes(body))
    except IndexRefused as exc:
        raise IndexUnavailable(f"{what}: {exc}") from None
    except httpx.InvalidURL as exc:  # a link or a redirect httpx cannot read
        raise IndexUnavailable(f"{what}: not a URL: {exc}") from None
    except httpx.TooManyRedirects:
        raise IndexUnavailable(f"{what}: more than {client.max_redirects} redirects") from None
    except httpx.HTTPError as exc:
        raise IndexUnavailable(f"cannot reach {what}: {_describe(exc, timeout)}") from None


def _index_files(
    client: httpx.Client, index_url: str, project: str, package: str, how: _How
) -> list[DistFile] | None:
    """The files an index lists for the project; None when it does not know the project."""
    base = index_url.rstrip("/")
    page = _fetch_page(client, f"{base}/{project}/", f"index {base}", *how)
    if page.status_code in (404, 410):
        return None
    if page.status_code != 200:
        raise IndexUnavailable(f"index {base} answered {page.status_code} for package '{package}'")
    if page.content_type in (JSON_TYPE, "application/json"):
        try:
            return _parse_json(json.loads(page.body), page.url)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IndexUnavailable(
                f"index {base} sent unreadable JSON for package '{package}': {exc}"
            ) from None
    return _parse_html(page.body.decode("utf-8", errors="replace"), page.url)


def _local_files(location: Path) -> list[DistFile]:
    paths = sorted(location.iterdir()) if location.is_dir() else [location]
    # A file's mtime is when it was copied, not when it was uploaded: upload_time stays None.
    return [
        DistFile(filename=p.name, url=p.resolve().as_uri())
        for p in paths
        if p.is_file() and file_identity(p.name) is not None
    ]


def _find_links_files(
    client: httpx.Client, location: str, how: _How, policy: FetchPolicy
) -> list[DistFile]:
    scheme = urlsplit(location).scheme
    if scheme in ("http", "https"):
        page = _fetch_page(client, location, f"find-links {location}", *how)
        if page.status_code != 200:
            raise IndexUnavailable(f"find-links {location} answered {page.status_code}")
        return _parse_html(page.body.decode("utf-8", errors="replace"), page.url)
    if not policy.local_paths:
        raise IndexUnavailable(
            f"find-links {location}: only http and https locations can be read here"
        )
    path = Path(unquote(urlsplit(location).path)) if scheme == "file" else Path(location)
    if not path.exists():
        raise IndexUnavailable(f"find-links location {location} does not exist")
    return _local_files(path)


def list_releases(
    package: str,
    *,
    index_url: str | None = PYPI_SIMPLE,
    extra_index_urls: Sequence[str] = (),
    find_links: Sequence[str | Path] = (),
    timeout: float = DEFAULT_TIMEOUT,
    force_format: Literal["json", "html"] | None = None,
    client: httpx.Client | None = None,
    policy: FetchPolicy = LOCAL,
) -> list[Release]:
    """Every release of `package` across the indexes and find-links, in PEP 440 order.

    `index_url=None` reads no primary index (find-links only, like `--no-index`).
    A file listed by several sources is kept once, from the first (primary index,
    extra indexes in order, then find-links). Raises `IndexUnavailable` when a source
    cannot be read, or when no index knows the package and find-links hold none of it.
    `force_format` asks for JSON or HTML only (tests; indexes without content negotiation).
    `policy` bounds what may be fetched (`FetchPolicy`).
    """
    project = canonicalize_name(package)
    accept = ACCEPT[force_format]
    indexes = ([index_url] if index_url else []) + list(extra_index_urls)
    own_client = client is None
    if client is None:
        client = _client(timeout, policy)
    how: _How = (accept, timeout, policy.max_bytes)
    files: list[DistFile] = []
    missing: list[str] = []
    try:
        for url in indexes:
            found = _index_files(client, url, project, package, how)
            if found is None:
                missing.append(url.rstrip("/"))
            else:
                files.extend(found)
        for location in find_links:
            files.extend(_find_links_files(client, str(location), how, policy))
    finally:
        if own_client:
            client.close()

    by_version: dict[Version, Release] = {}
    seen: set[str] = set()
    for f in files:
        ident = file_identity(f.filename)
        if ident is None or ident[0] != project or f.filename in seen:
            continue
        seen.add(f.filename)
        by_version.setdefault(ident[1], Release(version=ident[1])).files.append(f)
    if not by_version and missing:
        raise IndexUnavailable(f"package '{package}' not found on {missing[0]} (404)")
    return sorted(by_version.values(), key=lambda r: r.version)


PYPI_JSON = "https://pypi.org/pypi"


def project_urls(
    package: str,
    version: str,
    *,
    index_url: str | None = PYPI_SIMPLE,
    timeout: float = DEFAULT_TIMEOUT,
    policy: FetchPolicy = LOCAL,
) -> dict[str, str]:
    """A release's project URLs (label -> URL) from PyPI's JSON API; {} for any other
    index (the simple API has none) or a release PyPI does not know. Raises
    `IndexUnavailable` when PyPI cannot be read."""
    if (index_url or "").rstrip("/") != PYPI_SIMPLE:
        return {}
    url = f"{PYPI_JSON}/{canonicalize_name(package)}/{version}/json"
    with _client(timeout, policy) as client:
        page = _fetch_page(client, url, "PyPI's JSON API", "application/json", timeout,
                           policy.max_bytes)  # fmt: skip
    if page.status_code != 200:
        return {}
    try:
        info = json.loads(page.body)["info"]
        urls = {str(k): str(v) for k, v in (info.get("project_urls") or {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    if info.get("home_page"):
        urls.setdefault("Homepage", str(info["home_page"]))
    return urls


_PY_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def target_tags(python: str | None = None) -> tuple[str, list[ptags.Tag]]:
    """The target's Python version and the wheel tags it accepts on this machine.

    `python` is a version ("3.12", "3.12.1") or anything holding one ("cpython3.12",
    "/usr/bin/python3.12"); None means the running interpreter. For the running
    interpreter's minor version the tags are `sys_tags()`; for another, CPython tags
    for that version on this machine's platforms.
    """
    running = sys.version_info
    if python is None:
        return f"{running.major}.{running.minor}.{running.micro}", list(ptags.sys_tags())
    match = _PY_RE.search(python)
    if match is None:
        raise InvalidInput(
            f"cannot tell the Python version of '{python}'; write e.g. 3.12", field="python"
        )
    major, minor = int(match.group(1)), int(match.group(2))
    version = match.group(0)
    if (major, minor) == (running.major, running.minor):
        return version, list(ptags.sys_tags())
    platforms = list(ptags.platform_tags())
    tags = list(ptags.cpython_tags(python_version=(major, minor), platforms=platforms))
    tags += list(
        ptags.compatible_tags(
            python_version=(major, minor), interpreter=f"cp{major}{minor}", platforms=platforms
        )
    )
    return version, tags
