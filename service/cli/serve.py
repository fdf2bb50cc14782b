"""`bisect-cli serve`: the API server plus N embedded runner agents.

The API (`service.api.app.create_app`) runs under uvicorn in a thread; each
embedded runner is an `Agent` in a thread of its own that talks HTTP to the
API like any remote runner (with the first of BISECT_RUNNER_TOKENS when
tokens are configured), so one command on a laptop is a working service.

Auth: with no BISECT_API_TOKENS and no BISECT_RUNNER_TOKENS the API is open,
so it listens on 127.0.0.1 only (and says so); any other --host is refused.

SIGTERM / SIGINT: the runners stop first (a running trial gets --grace
seconds, else it is killed and its lease given back), leave, and then the API
shuts down; exit 0. A second signal skips the grace period.
"""

import ipaddress
import json
import logging
import signal
import socket
import threading
import time
from types import FrameType
from typing import Annotated

import typer
import uvicorn

from runners.agent import GRACE_S, Agent, default_name, describe_capabilities, stderr_log
from runners.client import ApiClient, ApiError, ApiUnreachable
from runners.nvml import GpuProbe
from service.cli import options as o
from service.cli.db import shown
from service.cli.errors import INTERNAL, fail
from service.db import upgrade
from service.settings import get_settings

LOOPBACK = "127.0.0.1"


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


def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="Address to listen on (default 127.0.0.1; others need tokens configured).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free).")
    ] = 8000,
    database_url: o.DatabaseUrl = None,
    runners: Annotated[
        int, typer.Option("--runners", min=0, max=64, help="Embedded local runner agents.")
    ] = 1,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0,
            help="On SIGTERM/SIGINT, seconds a running trial may take before it is killed and "
            "its lease given back.",
        ),
    ] = GRACE_S,
    json_: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON object (url, runners, auth) once listening."),
    ] = False,
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
    url = database_url or settings.effective_database_url
    settings = settings.model_copy(update={"database_url": url})
    notes: list[str] = []
    if not settings.auth_enabled:
        if host is not None and not is_loopback(host):
            fail(
                f"--host {host}: no tokens configured, so the API would be open to anyone; "
                "set BISECT_API_TOKENS and BISECT_RUNNER_TOKENS, or listen on 127.0.0.1"
            )
        notes.append(f"no tokens configured: listening on {host or LOOPBACK} only")
    host = host or LOOPBACK
    if runners > 0 and settings.auth_enabled and not settings.runner_tokens:
        fail(
            "--runners: embedded runners need a runner token; set BISECT_RUNNER_TOKENS "
            "(or use --runners 0)"
        )
    try:
        upgrade(url)
    except Exception as exc:  # noqa: BLE001 - any driver error is one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"--database-url: cannot open {shown(url)}: {first}")
    try:
        sock = bind(host, port)
    except OSError as exc:
        fail(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}", INTERNAL)
    port = sock.getsockname()[1]
    base = f"http://{_url_host(host)}:{port}"
    local = f"http://{_url_host(LOOPBACK if host in ('0.0.0.0', '') else host)}:{port}"
    if host == "::":
        local = f"http://[::1]:{port}"

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from service.api.app import create_app

    config = uvicorn.Config(
        create_app(settings),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    server_thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="api", daemon=True
    )
    stop = threading.Event()
    agents: list[Agent] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stderr_log(f"{signal.Signals(signum).name}: stopping")
        stop.set()
        for agent in agents:
            agent.stop()  # a second signal: no grace period

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server_thread.start()
    while not server.started and server_thread.is_alive():
        time.sleep(0.05)
    if not server.started:
        fail(f"the API did not start on {base}", INTERNAL)

    for note in notes:
        stderr_log(note)
    if json_:
        typer.echo(
            json.dumps(
                {
                    "url": base,
                    "api": f"{base}/api/v1",
                    "docs": f"{base}/docs",
                    "runners": runners,
                    "auth": settings.auth_enabled,
                    "database_url": shown(url),
                }
            )
        )
    else:
        typer.echo(f"listening on {base} (API {base}/api/v1, docs {base}/docs)")
    stderr_log(f"database {shown(url)}; {runners} embedded runner(s)")

    token = settings.runner_tokens[0].get_secret_value() if settings.runner_tokens else None
    gpu = GpuProbe.open() if runners else None
    capabilities = describe_capabilities(gpu) if runners else None
    threads = []
    for i in range(1, runners + 1):
        prefix = f"runner {i}: "

        def log(line: str, prefix: str = prefix) -> None:
            stderr_log(prefix + line)

        agent = Agent(
            ApiClient(local, token, on_retry=log),
            f"{default_name()}-{i}",
            {"embedded": "true"},
            settings.env_root,
            settings.uv_cache_dir,
            gpu,
            grace_s=grace,
            log=log,
            capabilities=capabilities,
        )
        agents.append(agent)
        if stop.is_set():
            agent.stop()
        thread = threading.Thread(target=_run_agent, args=(agent,), name=f"runner-{i}")
        threads.append(thread)
        thread.start()

    while not stop.is_set() and server_thread.is_alive():
        stop.wait(0.5)
    for agent in agents:
        agent.stop()
    for thread in threads:
        thread.join(grace + 30)
    crashed = not server_thread.is_alive()
    server.should_exit = True
    server_thread.join(15)
    if crashed:
        fail("the API stopped unexpectedly", INTERNAL)
    stderr_log("stopped")
    raise typer.Exit(0)


def _run_agent(agent: Agent) -> None:
    try:
        agent.run()
    except (ApiError, ApiUnreachable) as exc:
        agent.log(f"stopped: {exc}")
    except Exception as exc:  # noqa: BLE001 - one runner's failure must not take the API down
        agent.log(f"crashed: {type(exc).__name__}: {exc}")
