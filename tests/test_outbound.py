"""One outbound rule for every URL a job names (issue 26, rows 1 and 7, and row 9's
unresolvable host): refused at submission with one line, refused again by the runner
before git or uv starts, git told to follow no redirect, git's words withheld.

Every connection here goes to a loopback listener the test owns, and the point of most
tests is that the listener sees none: the rule refuses before anything connects. Name
lookups are faked (`no_dns`): only ``localhost`` and literal addresses resolve, so no test
asks a resolver anything either.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contract import outbound
from contract.outbound import Reach, Refused
from contract.wire import Cause, CommitRange, EnvSpec, Failure
from runners import commits, envs, gitrun, uvrun
from runners.egress import Egress
from service.app import create_app
from service.index import FetchPolicy, IndexUnavailable, list_releases
from service.settings import Settings

API = "/api/v1"
TOKEN = "alice-tok"
PUBLIC = "host {} is not a public address (list it in BISECT_ALLOWED_INDEXES)"
_REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture(autouse=True)
def no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``localhost`` and literal addresses resolve; any other name is not found."""

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name != "localhost":
            try:
                socket.inet_pton(socket.AF_INET6 if ":" in name else socket.AF_INET, name)
            except OSError:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return _REAL_GETADDRINFO(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)


def settings(tmp_path: Path, **fields: Any) -> Settings:
    """A deployment with a client token and no allowlist: public hosts only."""
    values: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp_path / 'outbound.db'}",
        "data_dir": tmp_path,
        "cache_dir": tmp_path / "cache",
        "reap_interval_s": 0,
        "trusted_hosts": ["testserver"],
        "api_tokens": f"alice:{TOKEN}",
        "allowed_indexes": [],
        **fields,
    }
    return Settings(**values)


def submit(tmp_path: Path, body: dict[str, Any], **fields: Any) -> tuple[int, Any]:
    job = {"package": "leakyfixture", "range": "1.0.0..1.0.9", "script": "pass", **body}
    with TestClient(create_app(settings(tmp_path, **fields))) as client:
        response = client.post(
            f"{API}/jobs", json=job, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    return response.status_code, response.json().get("detail")


@contextmanager
def listener() -> Iterator[tuple[int, list[Any]]]:
    """A loopback port that records every connection made to it (and closes it at once:
    "Empty reply from server" to whoever connected)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.05)
    accepted: list[Any] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = sock.accept()
            except TimeoutError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        sock.close()


# ------------------------------------------------------------------ the rule itself

NOT_PUBLIC = [
    "http://127.0.0.1:5432/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]:8080/",
    "http://[::127.0.0.1]/",
    "http://[64:ff9b::a00:1]/",
    "http://[2002:7f00:1::]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/",
    "http://10.1.2.3/",
    "http://192.168.0.1/",
    "http://172.16.0.1/",
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://[fc00::1]/",
    "http://localhost:5432/",
]


@pytest.mark.parametrize("url", NOT_PUBLIC)
def test_private_loopback_and_link_local_addresses_are_not_public(url: str) -> None:
    with pytest.raises(Refused) as refused:
        outbound.check(url, Reach())
    assert str(refused.value) == PUBLIC.format(outbound.parse(url).host)


@pytest.mark.parametrize(
    ("host", "plain"),
    [("2130706433", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"), ("0x7f.1", "127.0.0.1"),
     ("127.1", "127.0.0.1"), ("0", "0.0.0.0"), ("010.0.0.1", "8.0.0.1")],
)  # fmt: skip
def test_addresses_in_forms_parsers_disagree_on_are_refused_whatever_the_rule(
    host: str, plain: str
) -> None:
    """inet_aton (curl, git) reads them as `plain`, httpx refuses them: refused even with no
    rule, so no check and no connection can read them two ways."""
    for reach in (None, Reach(), Reach(hosts=("*",))):
        with pytest.raises(Refused) as refused:
            outbound.check(f"http://{host}/simple", reach)
        assert str(refused.value) == (
            f"host {host} is an address in a form parsers disagree on; write {plain}"
        )


def test_public_addresses_and_listed_hosts_pass() -> None:
    assert outbound.check("https://8.8.8.8/simple", Reach()).addresses[0].exploded == "8.8.8.8"
    listed = outbound.check("http://127.0.0.1:8080/simple", Reach(hosts=("127.0.0.1",)))
    assert listed.addresses == ()  # taken as named: the operator listed it
    with pytest.raises(Refused, match=r"^host 127\.0\.0\.2 is not in BISECT_ALLOWED_INDEXES$"):
        outbound.check("http://127.0.0.2/", Reach(hosts=("127.0.0.1",)))


def test_an_unresolvable_name_is_refused_not_taken_for_public() -> None:
    """Row 9: `_public()` called a name that does not resolve public."""
    with pytest.raises(Refused) as refused:
        outbound.check("https://nowhere.invalid/simple", Reach())
    assert str(refused.value) == (
        "host nowhere.invalid was not found (a name must resolve to be checked)"
    )


def test_the_service_refuses_an_unresolvable_index_host_before_fetching(tmp_path: Path) -> None:
    status, detail = submit(tmp_path, {"index_url": "https://nowhere.invalid/simple"})
    assert status == 422
    assert detail == (
        "index_url: index https://nowhere.invalid/simple: host nowhere.invalid was not found "
        "(a name must resolve to be checked)"
    )
    with pytest.raises(IndexUnavailable) as refused:
        list_releases("x", index_url="https://nowhere.invalid/simple",
                      policy=FetchPolicy(local_paths=False, reach=Reach()))  # fmt: skip
    assert str(refused.value) == (
        "index https://nowhere.invalid/simple: host nowhere.invalid was not found "
        "(a name must resolve to be checked)"
    )


# ---------------------------------------------------------------------- submission

ROW_1 = [
    ("http://127.0.0.1:5432/", "127.0.0.1", "public"),
    ("http://[::1]/", "::1", "public"),
    ("http://[::ffff:127.0.0.1]:9/", "::ffff:127.0.0.1", "public"),
    ("http://169.254.169.254/r.git", "169.254.169.254", "public"),
    ("http://10.0.0.5/r.git", "10.0.0.5", "public"),
    ("http://localhost:5432/r.git", "localhost", "public"),
    ("http://2130706433/", "2130706433", "127.0.0.1"),
    ("http://0177.0.0.1/r.git", "0177.0.0.1", "127.0.0.1"),
]


@pytest.mark.parametrize(("repo", "host", "why"), ROW_1)
def test_a_repository_on_a_private_address_is_refused_at_submission(
    tmp_path: Path, repo: str, host: str, why: str
) -> None:
    """Row 1: these were accepted (201) and cloned by a runner."""
    status, detail = submit(tmp_path, {"commits": True, "repo": repo})
    reason = (PUBLIC.format(host) if why == "public" else
              f"host {host} is an address in a form parsers disagree on; write {why}")  # fmt: skip
    assert (status, detail) == (422, f"repo: repository {repo.rstrip('/')}: {reason}")


def test_a_repository_outside_the_allowlist_is_refused_at_submission(tmp_path: Path) -> None:
    status, detail = submit(
        tmp_path, {"commits": True, "repo": "https://github.com/x/y"}, allowed_indexes=["pypi.org"]
    )
    assert (status, detail) == (
        422, "repo: repository https://github.com/x/y: host github.com is not in "
        "BISECT_ALLOWED_INDEXES",
    )  # fmt: skip


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "no-tokens"])
def test_index_urls_with_a_newline_or_an_octal_host_are_422_not_500(
    tmp_path: Path, tokens: bool
) -> None:
    """Row 7: both answered 500 (httpx refused them in the middle of the fetch)."""
    fields: dict[str, Any] = {"allowed_indexes": ["127.0.0.1"]}
    if not tokens:
        fields["api_tokens"] = []
    newline = "http://127.0.0.1:1/sim\nple"
    assert submit(tmp_path, {"index_url": newline}, **fields) == (
        422, f"index_url: index {newline!r}: a URL holds no space, control character or "
        "backslash",
    )  # fmt: skip
    assert submit(tmp_path, {"index_url": "http://0177.0.0.1/simple"}, **fields) == (
        422, "index_url: index http://0177.0.0.1/simple: host 0177.0.0.1 is an address in a "
        "form parsers disagree on; write 127.0.0.1",
    )  # fmt: skip
    assert submit(tmp_path, {"extra_index_urls": ["http://2130706433/simple"]}, **fields)[0] == 422


# ------------------------------------------------------------------------- runners


def test_a_runner_refuses_a_name_that_resolves_to_loopback_before_git_starts(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's check is not the last: a name can answer differently on the runner.
    ``localhost`` resolves to loopback there, so nothing starts and nothing connects."""
    started: list[list[str]] = []
    real_run = gitrun.run

    def spy(args: list[str], **kw: Any) -> gitrun.Done:
        started.append(args)
        return real_run(args, **kw)

    monkeypatch.setattr(gitrun, "run", spy)
    with listener() as (port, accepted):
        repo = f"http://localhost:{port}/r.git"
        found = commits.answer(
            CommitRange(repo=repo, package="p", good="1", bad="2", reach=Reach()),
            reachable_tmp / "git",
        )
    assert found["error"] == f"repository {repo}: {PUBLIC.format('localhost')}"
    assert (started, accepted) == ([], [])


def test_a_runner_refuses_index_urls_that_resolve_to_loopback_before_uv_starts(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(envs, "run_uv", lambda *a, **kw: ran.append(a))
    with listener() as (port, accepted):
        index = f"http://localhost:{port}/simple"
        for spec in (
            EnvSpec(package="p", version="1.0", index_url=index, reach=Reach()),
            EnvSpec(package="p", version="1.0", extra_index_urls=[index], reach=Reach()),
            EnvSpec(package="p", version="1.0", source=f"git+{index}@abc", reach=Reach()),
        ):
            with pytest.raises(envs.EnvError) as refused:
                envs.build_env(spec, root=reachable_tmp / "envs", cache_dir=reachable_tmp / "c")
            shown = "repository" if spec.source else "index"
            assert str(refused.value) == f"{shown} {index}: {PUBLIC.format('localhost')}"
            with pytest.raises(envs.EnvError):
                envs.resolve_pins(spec, cache_dir=reachable_tmp / "c")
    assert (ran, accepted) == ([], [])


def test_the_rule_decides_nothing_an_environment_holds() -> None:
    spec = EnvSpec(package="p", version="1.0")
    assert envs.spec_hash(spec) == envs.spec_hash(spec.model_copy(update={"reach": Reach()}))


class _Redirect(BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_git_follows_no_redirect_and_its_words_stay_on_the_runner(
    reachable_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listed repository that redirects to another port: git never goes there, and the
    job is told only that cloning failed (not "Empty reply from server", which a
    followed redirect to the closing listener would have said)."""
    seen: list[dict[str, str]] = []
    real_run = gitrun.run

    def spy(args: list[str], **kw: Any) -> gitrun.Done:
        seen.append(kw["env"])
        return real_run(args, **kw)

    monkeypatch.setattr(gitrun, "run", spy)
    with listener() as (port, accepted):
        handler = type("Redirect", (_Redirect,), {"target": f"http://127.0.0.1:{port}"})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            repo = f"http://127.0.0.1:{server.server_address[1]}/r.git"
            rule = Reach(hosts=("127.0.0.1",))
            found = commits.answer(
                CommitRange(repo=repo, package="p", good="1", bad="2", reach=rule),
                reachable_tmp / "git",
            )
        finally:
            server.shutdown()
            server.server_close()
    assert found["error"] == "cloning the repository failed"
    assert accepted == []
    config = {seen[0][f"GIT_CONFIG_KEY_{i}"]: seen[0][f"GIT_CONFIG_VALUE_{i}"]
              for i in range(int(seen[0]["GIT_CONFIG_COUNT"]))}  # fmt: skip
    assert config["http.followRedirects"] == "false"


def test_git_connects_to_the_addresses_checked() -> None:
    """A name is pinned to what it resolved to when checked (git's http.curloptResolve)."""
    allowed = outbound.allow(
        outbound.parse("https://forge.example/r.git"), Reach(),
        resolve=lambda host, port: ["8.8.8.8", "2001:4860:4860::8888"],
    )  # fmt: skip
    assert outbound.git_settings(allowed) == {
        "http.followRedirects": "false",
        "http.curloptResolve": "forge.example:443:8.8.8.8,[2001:4860:4860::8888]",
    }


UV_REFUSED = """\
error: Request failed after 3 retries in 7.9s
  cause: Failed to fetch: http://127.0.0.1:1/simple/leakyfixture/
  cause: error sending request for url (http://127.0.0.1:1/simple/leakyfixture/)
  cause: client error (Connect)
  cause: tcp connect error
  cause: Connection refused (os error 111)
"""
UV_NOT_FOUND = """\
error: No solution found when resolving dependencies
  cause: Because leakyfixture was not found in the package registry and you require
  leakyfixture, we can conclude that your requirements are unsatisfiable.
"""


def test_uv_failing_on_a_request_is_told_apart_from_what_an_index_held() -> None:
    assert uvrun.network_failure(UV_REFUSED)  # uv 0.9's own words, captured
    assert not uvrun.network_failure(UV_NOT_FOUND)


def test_under_the_rule_a_failed_fetch_is_one_line_without_uv_s_words(
    reachable_tmp: Path,
) -> None:
    # Port 1 on loopback refuses at once; the rule lists it (an operator's allowlist), so uv
    # runs and fails on the request: the job learns what the egress proxy decided (the
    # listed host it could not connect to), never uv's words.
    index = "http://127.0.0.1:1/simple"
    spec = EnvSpec(package="leakyfixture", version="1.0.0", index_url=index,
                   reach=Reach(hosts=("127.0.0.1:1",)))  # fmt: skip
    result = envs.build_env(spec, root=reachable_tmp / "envs", cache_dir=reachable_tmp / "c")
    line = "127.0.0.1:1 could not be reached from the runner"
    assert (result.ok, result.error) == (False, line)
    assert result.failure == Failure(cause=Cause.UNREACHABLE, host="127.0.0.1:1", message=line)


# --------------------------------------------------------------------------- uv's connections


@contextmanager
def redirecting(to: str) -> Iterator[int]:
    """A loopback server that answers every GET with a redirect to `to` + the path."""
    handler = type("Redirect", (_Redirect,), {"target": to})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def test_uv_is_never_connected_where_an_allowed_index_redirects(reachable_tmp: Path) -> None:
    """uv follows redirects and has no setting against it: under the rule its connections
    go through runners.egress, which judges each when it is made. The listed index
    redirects to a port the rule does not list; nothing connects there. The build and the
    resolution fail for the infrastructure, naming what the proxy decided (the host:port it
    refused and the rule's words: docs/security.md, what a job is told), not uv's words."""
    with listener() as (port, accepted), redirecting(f"http://127.0.0.1:{port}") as index_port:
        spec = EnvSpec(package="leakyfixture", version="1.0.0",
                       index_url=f"http://127.0.0.1:{index_port}/simple",
                       reach=Reach(hosts=(f"127.0.0.1:{index_port}",)))  # fmt: skip
        result = envs.build_env(spec, root=reachable_tmp / "envs", cache_dir=reachable_tmp / "c")
        with pytest.raises(envs.EnvError) as resolving:
            envs.resolve_pins(spec, cache_dir=reachable_tmp / "c")
    assert accepted == []
    rule, host = "host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES", f"127.0.0.1:{port}"
    refused = Failure(cause=Cause.REFUSED, host=host, rule=rule,
                      message=f"the job's outbound rule refused {host}: {rule}")  # fmt: skip
    assert (result.ok, result.error, result.failure) == (False, refused.message, refused)
    assert resolving.value.failure == refused
    assert str(resolving.value) == f"cannot resolve leakyfixture==1.0.0: {refused.message}"


def test_under_the_rule_a_listed_index_still_builds_through_the_proxy(
    reachable_tmp: Path, fixture_index: str
) -> None:
    host = fixture_index.split("/")[2]
    spec = EnvSpec(package="leakyfixture", version="1.0.0", index_url=fixture_index,
                   reach=Reach(hosts=(host,)))  # fmt: skip
    result = envs.build_env(spec, root=reachable_tmp / "envs", cache_dir=reachable_tmp / "c")
    assert result.ok, result.error
    assert "leakyfixture==1.0.0" in result.freeze
    assert envs.resolve_pins(spec, cache_dir=reachable_tmp / "c2") == ["leakyfixture==1.0.0"]


def test_the_proxy_refuses_before_connecting_and_forwards_one_request_a_connection() -> None:
    with listener() as (port, accepted), Egress(Reach(hosts=("127.0.0.1:1",))) as proxy:
        proxy_port = int(proxy.url.rsplit(":", 1)[1])
        for head in (f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n",
                     f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: a\r\n\r\n"):  # fmt: skip
            with socket.create_connection(("127.0.0.1", proxy_port)) as client:
                client.sendall(head.encode())
                assert client.recv(100).startswith(b"HTTP/1.1 403 ")
        with socket.create_connection(("127.0.0.1", proxy_port)) as client:
            client.sendall(b"nonsense\r\n\r\n")
            assert client.recv(100).startswith(b"HTTP/1.1 400 ")
    assert accepted == []
    assert proxy.refused == [
        f"127.0.0.1:{port}: host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES",
        f"http://127.0.0.1:{port}/x: host 127.0.0.1 is not in BISECT_ALLOWED_INDEXES",
    ]


def test_a_plain_request_goes_on_in_origin_form_with_connection_close() -> None:
    got: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            got.append(conn.recv(65536))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    threading.Thread(target=answer, daemon=True).start()
    port = server.getsockname()[1]
    with Egress(Reach(hosts=(f"127.0.0.1:{port}",))) as proxy:
        proxy_port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", proxy_port)) as client:
            client.sendall(f"GET http://127.0.0.1:{port}/simple/p/ HTTP/1.1\r\nHost: h\r\n"
                           "Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\n\r\n"
                           .encode())  # fmt: skip
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
    server.close()
    assert reply.endswith(b"\r\n\r\nok")
    assert got == [b"GET /simple/p/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"]
