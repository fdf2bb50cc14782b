"""Serve a directory of wheels as a PEP 503 (HTML) + PEP 691 (JSON) simple index on 127.0.0.1.

    with serve_index(wheel_dir) as url:   # url == "http://127.0.0.1:PORT/simple"
        subprocess.run(["uv", "pip", "install", "--index-url", url, "leakyfixture==1.0.2"])

Routes: `/simple/` (project list), `/simple/<normalized-name>/` (files; a name that is
not normalized, or lacks the trailing slash, is redirected), `/files/<filename>` (the
distributions). Pages negotiate on `Accept`: `application/vnd.pypi.simple.v1+json` gets
PEP 691 JSON (api-version 1.1, with PEP 700 `upload-time`, `size` and `versions`);
anything else gets HTML with `data-requires-python`, `data-yanked` and `#sha256=`.
File URLs on the pages are relative (`../../files/...`), as an index may make them; with
`files_at` they are absolute, under another base (``http://127.0.0.1:PORT/files/``): the
files then live on another host, as a mirror's often do (the egress tests list the index
and not the file host).

Per-file facts a wheel cannot carry come from `index.json` in the directory when
present (see `service.example.fixture`); without it every file is served as not
yanked, without Requires-Python or upload time.
"""

from __future__ import annotations

import hashlib
import html
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from packaging.utils import (
    canonicalize_name,
)

from service.example.fixture import INDEX_METADATA
from service.index import file_identity

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_V1_TYPE = "application/vnd.pypi.simple.v1+html"
HTML_TYPE = "text/html"
# Tie-break order when several types are equally acceptable.
_OFFERED = (JSON_TYPE, HTML_V1_TYPE, HTML_TYPE)


@dataclass(frozen=True)
class _File:
    project: str  # normalized
    version: str
    filename: str
    path: Path
    sha256: str
    size: int
    requires_python: str | None
    yanked: str | bool
    upload_time: str | None


def _scan(wheel_dir: Path) -> dict[str, list[_File]]:
    meta_path = wheel_dir / INDEX_METADATA
    meta = json.loads(meta_path.read_text())["files"] if meta_path.exists() else {}
    projects: dict[str, list[_File]] = {}
    for path in sorted(wheel_dir.iterdir()):
        parsed = file_identity(path.name) if path.is_file() else None
        if parsed is None:
            continue
        data = path.read_bytes()
        info = meta.get(path.name, {})
        projects.setdefault(parsed[0], []).append(
            _File(
                project=parsed[0],
                version=str(parsed[1]),
                filename=path.name,
                path=path,
                sha256=hashlib.sha256(data).hexdigest(),
                size=len(data),
                requires_python=info.get("requires_python"),
                yanked=info.get("yanked", False),
                upload_time=info.get("upload_time"),
            )
        )
    return projects


def negotiate(accept: str | None) -> str:
    """The content type to answer with for an `Accept` header.

    Each offered type takes the q-value of the most specific range that matches it;
    the highest q wins, an explicitly named type beats one matched by a wildcard, and
    JSON beats HTML on a tie. Wildcards alone (`*/*`, as curl and browsers send) and
    no header get HTML, the PEP 503 default.
    """
    if not accept:
        return HTML_TYPE
    ranges = _parse_accept(accept)
    scored = [(_score(ranges, offered), -rank, offered) for rank, offered in enumerate(_OFFERED)]
    (q, specificity), _, chosen = max(scored)
    if q <= 0:
        return HTML_TYPE
    if specificity == 0 and _score(ranges, HTML_TYPE)[0] == q:
        return HTML_TYPE
    return chosen


def _parse_accept(accept: str) -> list[tuple[str, float]]:
    """(media range, q) for each part of an Accept header; a bad q counts as 0."""
    ranges: list[tuple[str, float]] = []
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        q = 1.0
        for param in fields[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranges.append((fields[0].lower(), q))
    return ranges


def _score(ranges: list[tuple[str, float]], offered: str) -> tuple[float, int]:
    """(q, specificity) of the most specific range matching `offered`; (0, 0) for none."""
    best: tuple[int, float] | None = None  # (specificity, q)
    for media, q in ranges:
        if media == offered:
            specificity = 2
        elif media == offered.split("/")[0] + "/*":
            specificity = 1
        elif media == "*/*":
            specificity = 0
        else:
            continue
        if best is None or specificity > best[0]:
            best = (specificity, q)
    return (0.0, 0) if best is None else (best[1], best[0])


def _file_url(base: str | None, f: _File) -> str:
    return f"{base or '../../files/'}{quote(f.filename)}"


def _project_json(project: str, files: list[_File], base: str | None = None) -> bytes:
    versions = sorted({f.version for f in files})
    body = {
        "meta": {"api-version": "1.1"},
        "name": project,
        "versions": versions,
        "files": [
            {
                "filename": f.filename,
                "url": _file_url(base, f),
                "hashes": {"sha256": f.sha256},
                "requires-python": f.requires_python,
                "yanked": f.yanked,
                "size": f.size,
                **({"upload-time": f.upload_time} if f.upload_time else {}),
            }
            for f in files
        ],
    }
    return json.dumps(body).encode()


def _project_html(project: str, files: list[_File], base: str | None = None) -> bytes:
    links = []
    for f in files:
        attrs = [f'href="{html.escape(_file_url(base, f))}#sha256={f.sha256}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python)}"')
        if f.yanked is not False:
            reason = f.yanked if isinstance(f.yanked, str) else ""
            attrs.append(f'data-yanked="{html.escape(reason)}"')
        links.append(f"    <a {' '.join(attrs)}>{html.escape(f.filename)}</a><br/>")
    page = (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.1">\n'
        f"    <title>Links for {html.escape(project)}</title>\n  </head>\n  <body>\n"
        f"    <h1>Links for {html.escape(project)}</h1>\n"
        + "\n".join(links)
        + "\n  </body>\n</html>\n"
    )
    return page.encode()


def _root_json(projects: list[str]) -> bytes:
    return json.dumps(
        {"meta": {"api-version": "1.1"}, "projects": [{"name": p} for p in projects]}
    ).encode()


def _root_html(projects: list[str]) -> bytes:
    links = "\n".join(f'    <a href="{p}/">{html.escape(p)}</a><br/>' for p in projects)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.1">\n'
        "    <title>Simple index</title>\n  </head>\n  <body>\n"
        f"{links}\n  </body>\n</html>\n"
    ).encode()


class _IndexHandler(BaseHTTPRequestHandler):
    """Serves `wheel_dir` (set by `_handler`) as a PEP 503/691 index; its pages link the
    files under `files_at` when it is set (else relative, to this server's /files/)."""

    wheel_dir: Path
    files_at: str | None = None
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "text/plain",
        head: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _page(self, json_body: bytes, html_body: bytes, head: bool) -> None:
        ctype = negotiate(self.headers.get("Accept"))
        body = json_body if ctype == JSON_TYPE else html_body
        self._send(HTTPStatus.OK, body, ctype, head, {"Vary": "Accept"})

    def _serve(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        parts = [p for p in path.split("/") if p]
        if parts == ["simple"]:
            return self._root(path, head)
        if len(parts) == 2 and parts[0] == "simple":
            return self._project(path, parts[1], head)
        if len(parts) == 2 and parts[0] == "files":
            return self._file(parts[1], head)
        return self._send(HTTPStatus.NOT_FOUND, b"not found\n", head=head)

    def _root(self, path: str, head: bool) -> None:
        if not path.endswith("/"):
            return self._redirect("/simple/", head)
        names = sorted(_scan(self.wheel_dir))
        return self._page(_root_json(names), _root_html(names), head)

    def _project(self, path: str, given: str, head: bool) -> None:
        name = canonicalize_name(given)
        if name != given or not path.endswith("/"):
            return self._redirect(f"/simple/{name}/", head)
        projects = _scan(self.wheel_dir)
        if name not in projects:
            return self._send(HTTPStatus.NOT_FOUND, b"not found\n", head=head)
        files = projects[name]
        base = self.files_at
        return self._page(_project_json(name, files, base), _project_html(name, files, base), head)

    def _file(self, filename: str, head: bool) -> None:
        for files in _scan(self.wheel_dir).values():
            for f in files:
                if f.filename == filename:
                    body = f.path.read_bytes()
                    return self._send(HTTPStatus.OK, body, "application/octet-stream", head)
        return self._send(HTTPStatus.NOT_FOUND, b"not found\n", head=head)

    def _redirect(self, location: str, head: bool) -> None:
        self._send(HTTPStatus.MOVED_PERMANENTLY, b"", head=head, extra={"Location": location})


def _handler(wheel_dir: Path, files_at: str | None = None) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_IndexHandler,), {"wheel_dir": wheel_dir, "files_at": files_at})


@contextmanager
def serve_index(wheel_dir: Path, port: int = 0, files_at: str | None = None) -> Iterator[str]:
    """Serve `wheel_dir` on 127.0.0.1 (`port`; 0: a free one) while the block runs.

    Yields the index URL, `http://127.0.0.1:PORT/simple`. The directory is re-read
    on every request, so files added while serving show up. `files_at`: the base URL
    (ending in ``/``) the pages link files under, e.g. another `serve_index`'s
    ``http://127.0.0.1:PORT/files/``; None: this server's own.
    """
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(Path(wheel_dir), files_at))
    with serving(server, "leakyfixture-index") as port_served:
        yield f"http://127.0.0.1:{port_served}/simple"


@contextmanager
def serving(server: ThreadingHTTPServer, name: str) -> Iterator[int]:
    """Run `server` in a daemon thread while the block runs; yields its port."""
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
