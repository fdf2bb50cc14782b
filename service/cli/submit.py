"""`bisect-cli submit`: send a bisection to a server; `--wait` follows it like `run`.

It prints the job's status page (`page_url`, for a person; `--json` has the API's `url` too).

While it waits, each polled answer feeds the progress display as it came (`JobProgress`: the
cells and each running trial's status line, as `run` draws them, on stderr: redrawn in place
on a terminal, plain lines otherwise; with `--json` as without, as `run` does, so stdout holds
only the report); the last one is read into `JobPublic` (service/schemas.py) once, and the
report is printed from that model as `run` prints its own.
"""

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console

from runners.client import ApiClient, ApiError, ApiUnreachable
from service.cli.display import JobProgress, print_report
from service.cli.errors import BAD_INPUT, INTERNAL, fail
from service.cli.options import Json, job_request, with_job_options
from service.cli.remote import DEFAULT_SERVER, ArgvToken, Server, Token, api_errors, make_client
from service.options import OUTPUT
from service.schemas import JobCreated, JobPublic

POLL_S = 1.0
FINISHED = {"found", "bounds_failed", "inconclusive", "error", "cancelled"}


def fetch_curves(client: ApiClient, report: JobPublic) -> dict[int, list[float]]:
    """RSS series of the evidence trials, for the report's sparklines."""
    curves: dict[int, list[float]] = {}
    for item in report.evidence:
        for run in item.runs:
            samples = client.get_samples(run.trial_id)["samples"]
            curves[run.trial] = [float(s["rss"]) for s in samples]
    return curves


def wait_for(
    client: ApiClient, job_id: int, err: Console, poll_s: float = POLL_S
) -> dict[str, Any]:
    """Poll `GET /jobs/{id}` until the job has finished, showing its progress on `err`;
    its report."""
    with JobProgress(err, live=sys.stderr.isatty()) as progress:
        while True:
            report = client.get_job(job_id)
            progress.update(report)
            if report["status"] in FINISHED:
                return report
            time.sleep(poll_s)


@contextmanager
def following(job_id: int, page: str, err: Console) -> Iterator[None]:
    """While a job is followed (`submit --wait`, `ci`): Ctrl-C stops the waiting, not the
    job (130); a request that fails is one line saying the job may still be running."""
    try:
        yield
    except KeyboardInterrupt:
        err.print(
            f"stopped waiting; job {job_id} goes on: {page} (`bisect-cli cancel {job_id}` stops it)"
        )
        raise typer.Exit(130) from None
    except (ApiError, ApiUnreachable) as exc:
        code = BAD_INPUT if isinstance(exc, ApiError) and exc.status < 500 else INTERNAL
        fail(f"{exc} (job {job_id} may still be running: {page})", code)


Wait = Annotated[
    bool,
    typer.Option(
        "--wait",
        rich_help_panel=OUTPUT,
        help="Follow the job until it finishes; then print the report and exit as "
        "`bisect-cli run` does.",
    ),
]


@with_job_options("submit")
def submit(
    wait: Wait = False,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    argv_token: ArgvToken = None,
    json_: Json = False,
    **options: Any,
) -> None:
    """Submit a bisection to a leakbisect server and print the job's page URL.

    The server lists the releases at once, so a bad package or range fails here.
    With --wait: the same progress, report, JSON and exit status as `bisect-cli run`
    (0 found, 3 a bound failed its check, 4 inconclusive). Without --wait, 0 once
    submitted. Always: 2 bad input or a request the server refused (HTTP 4xx),
    1 server unreachable or failing, 130 interrupted while waiting (the job goes on).
    """
    if options.get("script") is None:
        fail("SCRIPT: missing; give the repro script to run")
    request = job_request(options)
    payload = request.model_dump(mode="json")
    err = Console(stderr=True)
    client = make_client(server, token)
    with client, api_errors():
        created = JobCreated.model_validate(client.submit(payload))
        job_id, url = created.id, created.page_url  # a person reads these lines
        if not wait:
            if json_:  # both: `url` for a client, `page_url` for a person
                typer.echo(json.dumps(created.model_dump(mode="json")))
            else:
                typer.echo(url)
            raise typer.Exit(0)
        if not json_:
            err.print(f"job {job_id}: {url}")
        with following(job_id, url, err):
            report = JobPublic.model_validate(wait_for(client, job_id, err))
            curves = {} if json_ else fetch_curves(client, report)
    # The same report as `bisect-cli run --json`: the server's extras are not part of it.
    print_report(report.report(), curves, json_)
