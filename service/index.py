"""List a package's releases from package indexes and find-links locations.

`list_releases` asks each index for `{index}/{normalized-name}/`, preferring PEP 691
JSON and falling back to PEP 503 HTML, and merges what the indexes and the find-links
locations (local directories or files, or flat HTML pages) hold into `Release` objects
(`service.releases`). `target_tags` gives the Python version and wheel tags that
`service.releases.installability` checks a release against.

Errors are `IndexUnavailable`, with a one-line message for the user.
"""

from __future__ import annotations

import os
import re
import ssl
import sys
from collections.abc import Sequence
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

from runners.errors import InvalidInput
from service.releases import DistFile, Release

PYPI_SIMPLE = "https://pypi.org/simple"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT_PREFER_JSON = f"{JSON_TYPE}, text/html;q=0.1"
ACCEPT = {
    None: ACCEPT_PREFER_JSON,
    "json": JSON_TYPE,
    "html": "application/vnd.pypi.simple.v1+html, text/html;q=0.1",
}
DEFAULT_TIMEOUT = 30.0


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


def _fetch_page(
    client: httpx.Client, url: str, what: str, accept: str, timeout: float
) -> httpx.Response:
    try:
        return client.get(url, headers={"Accept": accept})
    except httpx.HTTPError as exc:
        raise IndexUnavailable(f"cannot reach {what}: {_describe(exc, timeout)}") from None


def _index_files(
    client: httpx.Client,
    index_url: str,
    project: str,
    package: str,
    accept: str,
    timeout: float,
) -> list[DistFile] | None:
    """The files an index lists for the project; None when it does not know the project."""
    base = index_url.rstrip("/")
    response = _fetch_page(client, f"{base}/{project}/", f"index {base}", accept, timeout)
    if response.status_code in (404, 410):
        return None
    if response.status_code != 200:
        raise IndexUnavailable(
            f"index {base} answered {response.status_code} for package '{package}'"
        )
    ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
    page_url = str(response.url)
    if ctype in (JSON_TYPE, "application/json"):
        try:
            return _parse_json(response.json(), page_url)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IndexUnavailable(
                f"index {base} sent unreadable JSON for package '{package}': {exc}"
            ) from None
    return _parse_html(response.text, page_url)


def _local_files(location: Path) -> list[DistFile]:
    paths = sorted(location.iterdir()) if location.is_dir() else [location]
    # A file's mtime is when it was copied, not when it was uploaded: upload_time stays None.
    return [
        DistFile(filename=p.name, url=p.resolve().as_uri())
        for p in paths
        if p.is_file() and file_identity(p.name) is not None
    ]


def _find_links_files(
    client: httpx.Client, location: str, accept: str, timeout: float
) -> list[DistFile]:
    scheme = urlsplit(location).scheme
    if scheme in ("http", "https"):
        response = _fetch_page(client, location, f"find-links {location}", accept, timeout)
        if response.status_code != 200:
            raise IndexUnavailable(f"find-links {location} answered {response.status_code}")
        return _parse_html(response.text, str(response.url))
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
) -> list[Release]:
    """Every release of `package` across the indexes and find-links, in PEP 440 order.

    `index_url=None` reads no primary index (find-links only, like `--no-index`).
    A file listed by several sources is kept once, from the first (primary index,
    extra indexes in order, then find-links). Raises `IndexUnavailable` when a source
    cannot be read, or when no index knows the package and find-links hold none of it.
    `force_format` asks for JSON or HTML only (tests; indexes without content negotiation).
    """
    project = canonicalize_name(package)
    accept = ACCEPT[force_format]
    indexes = ([index_url] if index_url else []) + list(extra_index_urls)
    own_client = client is None
    if client is None:
        client = httpx.Client(
            timeout=timeout, follow_redirects=True, verify=_ssl_verify(), trust_env=True
        )
    files: list[DistFile] = []
    missing: list[str] = []
    try:
        for url in indexes:
            found = _index_files(client, url, project, package, accept, timeout)
            if found is None:
                missing.append(url.rstrip("/"))
            else:
                files.extend(found)
        for location in find_links:
            files.extend(_find_links_files(client, str(location), accept, timeout))
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
        raise ValueError(f"cannot tell the Python version of '{python}'; write e.g. 3.12")
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
