"""A loopback forward proxy that holds every connection uv makes to the job's outbound rule.

uv cannot be told to refuse a redirect, and it fetches whatever file URLs an index lists;
the runner's check of the index URLs before uv starts (`runners.envs`) says nothing about
those. So a build under a rule (`EnvSpec.reach`, contract/outbound.py) runs uv with
``HTTP_PROXY``/``HTTPS_PROXY`` pointing here, and each connection uv asks for is judged
when it is made:

1. One request head per connection, at most `MAX_HEAD` bytes, read within `HEAD_TIMEOUT_S`.
2. ``CONNECT host:port`` (https) is judged as ``https://host:port/``; an absolute-form
   request (``GET http://host:port/path``, plain http) as its URL. Anything else is 400.
3. The rule (`outbound.check`) decides against the addresses the name resolves to now; a
   refusal is ``403`` and no connection is made. An allowed name is connected to at the
   addresses checked (a listed host by its name: the operator trusts it), so a name that
   changes its answer between the check and the connection gains nothing.
4. A plain http request is forwarded in origin form with ``Connection: close``: every
   request of uv's comes on a connection of its own, each judged (a kept-alive connection
   could otherwise carry a request for another host to this one).
5. Bytes are then copied both ways until either side closes; the proxy never reads them.

Refusals are logged on the runner with the rule's reason; uv sees only the 403. The proxy
keeps what it decided (`Egress.refusals`: the ``host:port`` asked for and the rule's one
line; `Egress.unreachable`: the ``host:port`` it was allowed to connect to and could not),
and a build that fails reads them first (`runners.uvrun.classify`): they are the job's
own URLs' hosts, judged by the job's own rule, and are what the job is told of a refused
build (docs/security.md, what a job is told). uv's own words stay on the runner.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from contract import outbound
from contract.outbound import Reach, Refused

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Refusal:
    """One connection the rule refused: ``host:port`` as asked (the request's target
    when it is not a URL with a host) and the rule's one-line reason."""

    host: str
    reason: str


class Egress:
    """The proxy for one build: `url` while it runs (see the module docstring)."""

    def __init__(self, reach: Reach) -> None:
        self.reach = reach
        self.refused: list[str] = []  # "target: reason", for the runner's log and tests
        self.refusals: list[Refusal] = []
        self.unreachable: list[str] = []  # "host:port" allowed but not connected to
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name="egress", daemon=True)

    def __enter__(self) -> Egress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()

    def env(self) -> dict[str, str]:
        """The variables that send uv's requests here (no host is exempt)."""
        return {name: self.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")} | {
            "NO_PROXY": ""
        }

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:  # closed: the build is over
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            client.settimeout(HEAD_TIMEOUT_S)
            try:
                head, rest = _read_head(client)
                upstream, first = self._open(head)
            except _Answer as answer:
                with contextlib.suppress(OSError):
                    client.sendall(answer.response())
                return
            except OSError:
                return
            with upstream:
                client.settimeout(None)
                if first is None:  # CONNECT: the tunnel is open
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    upstream.sendall(first)
                if rest:
                    upstream.sendall(rest)
                _pipe(client, upstream)

    def _open(self, head: bytes) -> tuple[socket.socket, bytes | None]:
        """The upstream connection for `head`, and what to send it first (None: a tunnel)."""
        request_line, _, headers = head.partition(b"\r\n")
        parts = request_line.decode("latin-1").split(" ")
        if len(parts) != 3:
            raise _Answer(400, "one request line: METHOD TARGET VERSION")
        method, target, version = parts
        url = f"https://{target}/" if method == "CONNECT" else target
        try:
            allowed = outbound.check(url, self.reach)
        except Refused as exc:
            self.refused.append(f"{target}: {exc}")
            self.refusals.append(Refusal(_host_port(url) or target, str(exc)))
            log.warning("egress refused %s: %s", target, exc)
            raise _Answer(403, "refused by the job's outbound rule") from None
        host, port = allowed.target.host, allowed.target.port
        where = [str(a) for a in allowed.addresses] or [host]
        try:
            upstream = _connect(where, port)
        except _Answer:
            self.unreachable.append(_joined(host, port))
            raise
        if method == "CONNECT":
            return upstream, None
        path = _origin_form(target)
        kept = [
            line
            for line in headers.split(b"\r\n")
            if line and not line.lower().startswith((b"connection:", b"proxy-", b"keep-alive:"))
        ]
        first = b"\r\n".join(
            [f"{method} {path} {version}".encode("latin-1"), *kept, b"Connection: close"]
        )
        return upstream, first + b"\r\n\r\n"


class _Answer(Exception):
    def __init__(self, status: int, reason: str) -> None:
        self.status, self.reason = status, reason

    def response(self) -> bytes:
        body = f"{self.reason}\n".encode()
        return (
            f"HTTP/1.1 {self.status} {self.reason}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode() + body


def _joined(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host_port(url: str) -> str | None:
    """``host:port`` of `url`, None when it has none the rule could read."""
    try:
        target = outbound.parse(url)
    except Refused:
        return None
    return _joined(target.host, target.port)


def _read_head(client: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise _Answer(431, "request head too large")
        chunk = client.recv(_CHUNK)
        if not chunk:
            raise _Answer(400, "the request ended before its head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _origin_form(target: str) -> str:
    after_scheme = target.split("://", 1)[1] if "://" in target else target
    slash = after_scheme.find("/")
    return after_scheme[slash:] if slash >= 0 else "/"


def _connect(addresses: list[str], port: int) -> socket.socket:
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            error = exc
    raise _Answer(502, f"cannot connect ({error.strerror if error else 'no address'})")


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until either side closes (one direction in a helper thread)."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(_CHUNK):
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=copy, args=(b, a), daemon=True)
    other.start()
    copy(a, b)
    other.join()


@contextlib.contextmanager
def egress(reach: Reach | None) -> Iterator[Egress | None]:
    """The proxy for uv under `reach` (its variables: `Egress.env`), or None (no rule: the
    user's own job, no proxy)."""
    if reach is None:
        yield None
        return
    with Egress(reach) as proxy:
        yield proxy
