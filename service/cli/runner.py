"""`bisect-cli runner`: the runner agent (register, lease, run trials, report)."""

import json
import time
from typing import Annotated

import typer

from runners.agent import GRACE_S, Agent, default_name, parse_labels, stderr_log
from runners.nvml import GpuProbe
from service.cli.errors import fail
from service.cli.executor import make_executor, with_executor_options
from service.cli.remote import DEFAULT_SERVER, Server, api_errors, make_client
from service.settings import get_settings

RunnerToken = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="BISECT_RUNNER_TOKEN",
        help="Runner token, one of the server's BISECT_RUNNER_TOKENS (env BISECT_RUNNER_TOKEN).",
        show_default=False,
    ),
]


def json_log(line: str) -> None:
    typer.echo(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": line}), err=True)


@with_executor_options
def runner(
    server: Server = DEFAULT_SERVER,
    token: RunnerToken = None,
    labels: Annotated[
        str | None,
        typer.Option(
            "--labels", envvar="BISECT_RUNNER_LABELS", help="Labels, k=v,k2=v2 (shown per runner)."
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Name shown for this runner (default: host-pid)."),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0,
            help="On SIGTERM/SIGINT, seconds the running trial may take to finish before it "
            "is killed and its lease given back.",
        ),
    ] = GRACE_S,
    json_: Annotated[
        bool, typer.Option("--json", help="Log one JSON object per line on stderr.")
    ] = False,
) -> None:
    """Run trials for a leakbisect server until stopped.

    The runner registers (GPUs, memory, CPUs, Pythons, labels), long-polls for
    trial leases, builds each candidate's environment with uv and runs the repro
    under the memory cap, heartbeating; it never sees the database. SIGTERM or
    SIGINT: take no new trial; the running one gets --grace seconds to finish,
    else it is killed and given back; then the runner leaves and exits 0 (a
    second signal skips the grace period). Exit 2: bad --labels or the server
    refused the registration (HTTP 4xx, e.g. a wrong token); 1: server unreachable.
    """
    try:
        parsed = parse_labels(labels)
    except ValueError as exc:
        fail(f"--labels: {exc}")
    log = json_log if json_ else stderr_log
    settings = get_settings()
    client = make_client(server, token, on_retry=log)
    gpu = GpuProbe.open()
    # the sandbox users and directories (or the engine and image), before registering
    executor = make_executor(settings, gpu, name := name or default_name())
    agent = Agent(
        client,
        name or default_name(),
        parsed,
        executor,
        gpu,
        grace_s=grace,
        log=log,
    )
    agent.install_signal_handlers()
    with client, api_errors():
        code = agent.run()
    raise typer.Exit(code)
