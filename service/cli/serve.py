"""`bisect-cli serve`: the API server plus N embedded runner agents.

The API (`service.app.create_app`) runs under uvicorn in a thread; each
embedded runner is an `Agent` in a thread of its own that talks HTTP to the
API like any remote runner (with the first of BISECT_RUNNER_TOKENS when
tokens are configured), so one command on a laptop is a working service.

Auth: with no BISECT_API_TOKENS and no BISECT_RUNNER_TOKENS the API is open,
so it listens on 127.0.0.1 only (and says so); any other --host is refused.

Slow clients: a request's head must arrive within BISECT_HEADER_TIMEOUT_S of the
connection (or of the previous response), its body within BISECT_BODY_TIMEOUT_S of the
head (`DeadlineProtocol`); an idle kept-alive connection closes after BISECT_KEEP_ALIVE_S;
beyond BISECT_MAX_CONNECTIONS connections or requests at once, uvicorn answers 503.

SIGTERM / SIGINT: the runners stop first (a running trial gets --grace
seconds, else it is killed and its lease given back), leave, and then the API
shuts down; exit 0. A second signal skips the grace period.

--workers N (Postgres only): the API runs in N uvicorn worker processes that
accept on the one socket bound here, to use more than one core (one process
is bound to one by the GIL: docs/bench-api.md). The database is migrated once,
here, before they start; each worker builds its app from the environment
(`worker_app`), so the --database-url given here is exported as
BISECT_DATABASE_URL. Each worker runs the maintenance thread, which is safe on
Postgres (the reaper skips locked rows and updates conditionally; `advance`
takes the job row lock) but not on SQLite, whose job lock is per process, so
SQLite serves from one process. Workers sit in a process group of their own
(a Ctrl-C on the terminal reaches this process only, which stops the runners
before the API) and die with it on Linux.
"""

import asyncio
import functools
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import Annotated, Any

import h11
import typer
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.supervisors import Multiprocess

from contract.wire import API_PREFIX
from runners.agent import GRACE_S, Agent, default_name, describe_capabilities, stderr_log
from runners.client import ApiClient, ApiError, ApiUnreachable
from runners.nvml import open_probe
from service.cli.db import results_database, shown
from service.cli.errors import INTERNAL, fail
from service.cli.executor import make_executor, with_executor_options
from service.cli.options import DatabaseUrl
from service.db import upgrade
from service.settings import Settings, get_settings

LOOPBACK = "127.0.0.1"
SQLITE_WORKERS = (
    "--workers: SQLite serves from one process; use a postgresql+psycopg:// --database-url "
    "for more workers"
)
LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket for uvicorn; OSError (in use, no such address) as is."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _url_host(host: str) -> str:
    host = host.strip("[]")
    return f"[{host}]" if ":" in host else host


Host = Annotated[
    str | None,
    typer.Option(
        "--host",
        help="Address to listen on (default 127.0.0.1; others need tokens configured).",
        show_default=False,
    ),
]
Port = Annotated[
    int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free).")
]
Runners = Annotated[
    int, typer.Option("--runners", min=0, max=64, help="Embedded local runner agents.")
]
Grace = Annotated[
    float,
    typer.Option(
        "--grace",
        min=0,
        help="On SIGTERM/SIGINT, seconds a running trial may take before it is killed and "
        "its lease given back.",
    ),
]
Workers = Annotated[
    int,
    typer.Option(
        "--workers",
        min=1,
        max=64,
        help="API worker processes sharing the port (Postgres only for more than 1; "
        "the embedded runners stay in this process).",
    ),
]
ServeJson = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON object (url, runners, auth) once listening."),
]


@with_executor_options
def serve(
    host: Host = None,
    port: Port = 8000,
    database_url: DatabaseUrl = None,
    runners: Runners = 1,
    grace: Grace = GRACE_S,
    workers: Workers = 1,
    json_: ServeJson = False,
) -> None:
    """Run the leakbisect API, plus N local runners so one command gives a working service.

    Tokens come from BISECT_API_TOKENS (submit/read) and BISECT_RUNNER_TOKENS
    (runners), comma-separated; with neither, the API is open and listens on
    127.0.0.1 only. The database (BISECT_DATABASE_URL or --database-url; SQLite
    by default) is migrated at start. Lease timing: BISECT_LEASE_S,
    BISECT_HEARTBEAT_S, BISECT_MAX_ATTEMPTS, BISECT_REAP_INTERVAL_S.
    Exit status: 0 stopped by SIGTERM/SIGINT, 2 bad options, 1 cannot listen.
    """
    settings = get_settings()
    url = results_database(database_url)
    settings = settings.model_copy(update={"database_url": url})
    host, notes = _checked_host(settings, host, runners, workers)
    _migrate(url)
    sock = _listen(host, port)
    base, local = _urls(host, sock.getsockname()[1])

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    api = _Api(settings, sock, workers)
    stop = threading.Event()
    agents: list[Agent] = []
    _on_signals(stop, agents)
    if not api.start(stop):
        api.stop()
        fail(f"the API did not start on {base}", INTERNAL)
    for note in notes:
        stderr_log(note)
    _announce(base, url, runners, workers, settings.auth_enabled, json_)
    threads = _start_runners(settings, local, runners, grace, agents, stop)
    while not stop.is_set() and api.alive():
        stop.wait(0.5)
    for agent in agents:
        agent.stop()
    for thread in threads:
        thread.join(grace + 30)
    crashed = not api.alive()
    api.stop()
    if crashed:
        fail("the API stopped unexpectedly", INTERNAL)
    stderr_log("stopped")
    raise typer.Exit(0)


def _checked_host(
    settings: Settings, host: str | None, runners: int, workers: int
) -> tuple[str, list[str]]:
    """The address to listen on, after the checks that keep an open API private."""
    if workers > 1 and settings.effective_database_url.startswith("sqlite"):
        fail(SQLITE_WORKERS)
    notes: list[str] = []
    if not settings.auth_enabled:
        if host is not None and not is_loopback(host):
            fail(
                f"--host {host}: no tokens configured, so the API would be open to anyone; "
                "set BISECT_API_TOKENS and BISECT_RUNNER_TOKENS, or listen on 127.0.0.1"
            )
        notes.append(f"no tokens configured: listening on {host or LOOPBACK} only")
    if runners > 0 and settings.auth_enabled and not settings.runner_tokens:
        fail(
            "--runners: embedded runners need a runner token; set BISECT_RUNNER_TOKENS "
            "(or use --runners 0)"
        )
    return host or LOOPBACK, notes


def _migrate(url: str) -> None:
    try:
        upgrade(url)
    except Exception as exc:  # noqa: BLE001 - any driver error is one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"--database-url: cannot open {shown(url)}: {first}")


def _listen(host: str, port: int) -> socket.socket:
    try:
        return bind(host, port)
    except OSError as exc:
        fail(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}", INTERNAL)


def _urls(host: str, port: int) -> tuple[str, str]:
    """The API's URL as announced, and the one the embedded runners use."""
    base = f"http://{_url_host(host)}:{port}"
    if host == "::":
        return base, f"http://[::1]:{port}"
    return base, f"http://{_url_host(LOOPBACK if host in ('0.0.0.0', '') else host)}:{port}"


def _on_signals(stop: threading.Event, agents: list[Agent]) -> None:
    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stderr_log(f"{signal.Signals(signum).name}: stopping")
        stop.set()
        for agent in agents:
            agent.stop()  # a second signal: no grace period

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _announce(base: str, url: str, runners: int, workers: int, auth: bool, json_: bool) -> None:
    if json_:
        typer.echo(
            json.dumps(
                {
                    "url": base,
                    "api": f"{base}{API_PREFIX}",
                    "docs": f"{base}/docs",
                    "runners": runners,
                    "workers": workers,
                    "auth": auth,
                    "database_url": shown(url),
                }
            )
        )
    else:
        typer.echo(
            f"listening on {base} (status page {base}/, API {base}{API_PREFIX}, docs {base}/docs)"
        )
    stderr_log(
        f"database {shown(url)}; {runners} embedded runner(s)"
        + (f"; {workers} API worker processes" if workers > 1 else "")
    )


def _start_runners(
    settings: Settings,
    local: str,
    runners: int,
    grace: float,
    agents: list[Agent],
    stop: threading.Event,
) -> list[threading.Thread]:
    """Start the embedded runner agents, each talking HTTP to the API like a remote one."""
    if runners == 0:
        return []
    token = settings.runner_tokens[0].get_secret_value() if settings.runner_tokens else None
    gpu = open_probe(settings.gpu_exclusive, sharers=runners)
    capabilities = describe_capabilities(gpu)
    threads = []
    for i in range(1, runners + 1):

        def log(line: str, prefix: str = f"runner {i}: ") -> None:
            stderr_log(prefix + line)

        agent = Agent(
            ApiClient(local, token, on_retry=log),
            f"{default_name()}-{i}",
            {"embedded": "true"},
            make_executor(settings, gpu, f"{default_name()}-{i}"),
            gpu,
            grace_s=grace,
            log=log,
            capabilities=capabilities,
            state_dir=settings.data_dir / "runners" / str(i),  # reports kept across restarts
        )
        agents.append(agent)
        if stop.is_set():
            agent.stop()
        thread = threading.Thread(target=_run_agent, args=(agent,), name=f"runner-{i}")
        threads.append(thread)
        thread.start()
    return threads


def _run_agent(agent: Agent) -> None:
    try:
        agent.run()
    except (ApiError, ApiUnreachable) as exc:
        agent.log(f"stopped: {exc}")
    except Exception as exc:  # noqa: BLE001 - one runner's failure must not take the API down
        agent.log(f"crashed: {type(exc).__name__}: {exc}")


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines: a request's head must arrive within
    `head_s` of the connection opening (or of the previous response on a kept-alive one),
    and its body within `body_s` of the head, else the connection is closed.

    uvicorn bounds a head's size (h11's 16 KiB: beyond it, 400) and an idle kept-alive
    connection (`timeout_keep_alive`), but has no deadline before a connection's first
    request, and any byte cancels its keep-alive timer: a client sending nothing, or a byte
    a second, held its connection for ever. A deadline runs per phase of the request
    (h11's ``their_state``: IDLE waits for a head, SEND_BODY for the body) and is not
    renewed by the bytes that trickle in; while the app answers there is none (a long
    response, such as an event stream, is the app's to bound).
    """

    def __init__(self, *args: Any, head_s: float, body_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = {h11.IDLE: head_s, h11.SEND_BODY: body_s}
        self._phase: type[h11.Sentinel] | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Arm the deadline of the phase the request is in, when that phase begins."""
        phase = self.conn.their_state
        if phase is self._phase:
            return
        self._phase = phase
        self._disarm()
        limit = self._limits.get(phase)
        if limit is not None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(limit, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class _Api:
    """The API on `sock`: uvicorn in a thread (1 worker) or N worker processes.

    With workers, uvicorn's `Multiprocess` supervisor starts them on the
    pre-bound socket and, from a thread here, replaces any that die; its own
    SIGINT/SIGTERM handlers are replaced by serve's, which stop the runners first.
    """

    def __init__(self, settings: Settings, sock: socket.socket, workers: int) -> None:
        self.sock = sock
        self.workers = workers
        self.supervisor: Multiprocess | None = None
        self.server: uvicorn.Server | None = None
        common: dict[str, Any] = {
            "log_level": "warning",
            "access_log": False,
            "timeout_graceful_shutdown": 5,
            # Slow clients (docs/security.md): read deadlines uvicorn lacks, its keep-alive
            # timeout, and how many connections and requests it serves at once (503 beyond).
            "http": functools.partial(
                DeadlineProtocol,
                head_s=settings.header_timeout_s,
                body_s=settings.body_timeout_s,
            ),
            "timeout_keep_alive": settings.keep_alive_s,
            "limit_concurrency": settings.max_connections,
            # Whose X-Forwarded-Proto/-For to believe (https for Secure cookies, the client
            # address for the login throttle): service/web/auth.py.
            "forwarded_allow_ips": settings.forwarded_allow_ips,
        }
        if workers > 1:
            # Spawned workers read their settings from the environment.
            os.environ["BISECT_DATABASE_URL"] = settings.effective_database_url
            config = uvicorn.Config(
                "service.cli.serve:worker_app", factory=True, workers=workers, **common
            )
            self.supervisor = Multiprocess(config, [sock])  # installs handlers: serve's follow
            self.thread = threading.Thread(target=self._supervise, name="api", daemon=True)
        else:
            from service.app import create_app

            self.server = uvicorn.Server(uvicorn.Config(create_app(settings), **common))
            self.thread = threading.Thread(
                target=self.server.run, kwargs={"sockets": [sock]}, name="api", daemon=True
            )

    def start(self, stop: threading.Event, timeout: float = 60) -> bool:
        """Start serving; False if the API (every worker) did not come up."""
        if self.supervisor is not None:
            self.supervisor.init_processes()
            ready = all(
                p.wait_until_ready(timeout, stop) for p in self.supervisor.processes
            )  # fmt: skip
            if ready:
                self.thread.start()
            return ready
        assert self.server is not None
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.05)
        return self.server.started

    def _supervise(self) -> None:
        assert self.supervisor is not None
        while not self.supervisor.should_exit.wait(0.5):
            self.supervisor.handle_signals()  # SIGHUP: replace the workers one by one
            self.supervisor.keep_subprocess_alive()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.should_exit.set()
            if self.thread.is_alive():
                self.thread.join(15)
            self.supervisor.terminate_all()
            self.supervisor.join_all()
            return
        assert self.server is not None
        self.server.should_exit = True
        self.thread.join(15)


def worker_app() -> FastAPI:
    """The app of one `serve --workers N` worker process (the parent migrated already)."""
    # Out of the terminal's process group: a Ctrl-C reaches serve, which stops its runners
    # before it stops the workers (SIGTERM).
    os.setpgid(0, 0)
    if sys.platform == "linux":
        import ctypes

        # PR_SET_PDEATHSIG: go when serve goes, even if it was killed.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from service.app import create_app

    return create_app(migrate=False)
