"""git's smart HTTP protocol on 127.0.0.1, as a forge serves it: ``git http-backend`` as CGI.

`serve_smart(root)` serves every bare repository under `root` while the block runs and
yields the base URL (``http://127.0.0.1:PORT``); ``filters=True`` lets clients leave out
blobs (``uploadpack.allowFilter``, as GitHub and GitLab do), and any commit may be
fetched by its sha (``uploadpack.allowAnySHA1InWant``: what uv's ``git+URL@SHA`` asks).
A commits listing (runners/commits.py) refuses git's dumb HTTP protocol, so this is what
tests and the example serve. Loopback only; one ``git http-backend`` per request.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from service.example.index import serving


class _Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: no keep-alive to get wrong

    def __init__(self, *args: object, root: str, filters: bool, **kw: object) -> None:
        self.root, self.filters = root, filters
        super().__init__(*args, **kw)  # type: ignore[arg-type]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - the base's name
        self._cgi()

    def do_POST(self) -> None:  # noqa: N802 - the base's name
        self._cgi()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        self.rfile.readline()
        return b"".join(chunks)

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        body = self._body()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_PROJECT_ROOT": self.root, "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command, "PATH_INFO": unquote(path), "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1",
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }  # fmt: skip
        config = ["-c", f"uploadpack.allowFilter={str(self.filters).lower()}",
                  "-c", "uploadpack.allowAnySHA1InWant=true"]  # fmt: skip
        done = subprocess.run(["git", *config, "http-backend"], input=body, env=env,
                              capture_output=True, check=False)  # fmt: skip
        end = b"\r\n\r\n" if b"\r\n\r\n" in done.stdout else b"\n\n"
        head, _, payload = done.stdout.partition(end)
        status, headers = 200, []
        for line in head.decode(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def serve_smart(root: Path, *, filters: bool = True, port: int = 0) -> Iterator[str]:
    """Serve the bare repositories under `root` over smart HTTP on 127.0.0.1 while the
    block runs; yields ``http://127.0.0.1:PORT`` (a repository's URL adds its path)."""
    handler = functools.partial(_Backend, root=str(Path(root).resolve()), filters=filters)
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    with serving(server, "git-smart-http") as port_served:
        yield f"http://127.0.0.1:{port_served}"
