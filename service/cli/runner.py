"""`bisect-cli runner`: the runner agent (register, lease, run trials, report).

The runner token never goes on the command line (every user can read a process's argv in
/proc/PID/cmdline): it comes from `--token-file` / BISECT_RUNNER_TOKEN_FILE, else from
BISECT_RUNNER_TOKEN. `--token` is refused with a one-line error saying so, and so is a
token file that group or others can read (service/cli/remote.py `read_token_file`), exit 2.
"""

import json
import os
import time
from pathlib import Path
from typing import Annotated

import typer

from runners.agent import GRACE_S, Agent, default_name, parse_labels, stderr_log
from runners.nvml import open_probe
from service.cli.errors import fail
from service.cli.executor import make_executor, with_executor_options
from service.cli.remote import (
    DEFAULT_SERVER,
    Server,
    api_errors,
    make_client,
    read_token_file,
)
from service.settings import get_settings

TOKEN_ENV = "BISECT_RUNNER_TOKEN"

TokenFile = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        envvar="BISECT_RUNNER_TOKEN_FILE",
        help="File holding the runner token, one of the server's BISECT_RUNNER_TOKENS, "
        "mode 0600 (env BISECT_RUNNER_TOKEN_FILE); else the token is read from env "
        "BISECT_RUNNER_TOKEN. "
        "Never on the command line: argv is readable by every user.",
        show_default=False,
        dir_okay=False,
    ),
]
# Refused: kept only to say why instead of "no such option".
ArgvToken = Annotated[str | None, typer.Option("--token", hidden=True, show_default=False)]
StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="BISECT_RUNNER_STATE_DIR",
        help="Where finished reports wait until the server takes them, kept across restarts "
        "(env BISECT_RUNNER_STATE_DIR; default: BISECT_DATA_DIR/runner).",
        show_default=False,
        file_okay=False,
    ),
]


def read_token(token_file: Path | None) -> str | None:
    """The runner token from `token_file`, else BISECT_RUNNER_TOKEN; None when neither."""
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    return read_token_file("--token-file", token_file)


def json_log(line: str) -> None:
    typer.echo(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": line}), err=True)


@with_executor_options
def runner(
    server: Server = DEFAULT_SERVER,
    token_file: TokenFile = None,
    argv_token: ArgvToken = None,
    state_dir: StateDir = None,
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

    A finished report is kept in --state-dir until the server takes it, through outages and
    restarts of the server or of this runner. The token is read from --token-file or env
    BISECT_RUNNER_TOKEN, never from the command line.
    """
    if argv_token is not None:
        fail(
            "--token: a token on the command line is readable by every user "
            "(/proc/PID/cmdline); use --token-file FILE or env BISECT_RUNNER_TOKEN"
        )
    token = read_token(token_file)
    try:
        parsed = parse_labels(labels)
    except ValueError as exc:
        fail(f"--labels: {exc}")
    log = json_log if json_ else stderr_log
    settings = get_settings()
    client = make_client(server, token, on_retry=log)
    gpu = open_probe(settings.gpu_exclusive)
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
        state_dir=state_dir or settings.data_dir / "runner",
    )
    agent.install_signal_handlers()
    with client, api_errors():
        code = agent.run()
    raise typer.Exit(code)
