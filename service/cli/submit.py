"""`bisect-cli submit`: send a bisection to a server; `--wait` follows it like `run`."""

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from runners.client import ApiClient, ApiError, ApiUnreachable
from service.cli import options as o
from service.cli.display import JobProgress
from service.cli.errors import BAD_INPUT, INTERNAL, fail
from service.cli.remote import DEFAULT_SERVER, Server, Token, api_errors, make_client
from service.cli.run import job_request, print_report

POLL_S = 1.0
FINISHED = {"found", "bounds_failed", "inconclusive", "error", "cancelled"}


def fetch_curves(client: ApiClient, report: dict[str, Any]) -> dict[int, list[float]]:
    """RSS series of the evidence trials, for the report's sparklines."""
    curves: dict[int, list[float]] = {}
    for item in report.get("evidence") or []:
        for run in item["runs"]:
            samples = client.get_samples(run["trial"])["samples"]
            curves[run["trial"]] = [float(s["rss"]) for s in samples]
    return curves


def wait_for(
    client: ApiClient, job_id: int, err: Console, json_: bool, poll_s: float = POLL_S
) -> dict[str, Any]:
    """Poll `GET /jobs/{id}` until the job has finished; its report."""
    live = sys.stderr.isatty() and not json_
    quiet = Console(stderr=True, quiet=True) if json_ else err
    with JobProgress(quiet, live=live) as progress:
        while True:
            report = client.get_job(job_id)
            progress.update(report)
            if report["status"] in FINISHED:
                return report
            time.sleep(poll_s)


def submit(
    script: Annotated[
        Path | None, typer.Argument(help="The repro script.", show_default=False)
    ] = None,
    package: o.Package = None,
    range_: o.Range = None,
    index_url: o.IndexUrl = None,
    extra_index_url: o.ExtraIndexUrl = None,
    find_links: o.FindLinks = None,
    with_: o.With = None,
    requirements: o.RequirementsFile = None,
    python: o.Python = None,
    pre: o.Pre = False,
    skip_yanked: o.SkipYanked = False,
    as_released: o.AsReleased = False,
    find_fix: o.FindFix = False,
    repeats: o.Repeats = 1,
    max_runs: o.MaxRuns = 3,
    timeout: o.Timeout = 600.0,
    memory_limit: o.MemoryLimit = None,
    sample_hz: o.SampleHz = 10.0,
    requires_gpu: Annotated[
        bool, typer.Option("--requires-gpu", help="Run only on runners with a GPU.")
    ] = False,
    min_growth: o.MinGrowth = None,
    min_growth_fraction: o.MinGrowthFraction = None,
    reuse: o.Reuse = True,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Follow the job until it finishes; then print the report and exit as "
            "`bisect-cli run` does.",
        ),
    ] = False,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    json_: o.Json = False,
) -> None:
    """Submit a bisection to a leakbisect server and print the job's URL.

    The server lists the releases at once, so a bad package or range fails here.
    With --wait: the same progress, report, JSON and exit status as `bisect-cli run`
    (0 found, 3 a bound failed its check, 4 inconclusive). Without --wait, 0 once
    submitted. Always: 2 bad input or a request the server refused (HTTP 4xx),
    1 server unreachable or failing, 130 interrupted while waiting (the job goes on).
    """
    if script is None:
        fail("SCRIPT: missing; give the repro script to run")
    request = job_request(
        script,
        package,
        range_,
        with_=with_,
        requirements_file=requirements,
        python=python,
        index_url=index_url,
        extra_index_urls=extra_index_url or [],
        find_links=find_links or [],
        pre=pre,
        skip_yanked=skip_yanked,
        as_released=as_released,
        find_fix=find_fix,
        repeats=repeats,
        max_runs=max_runs,
        timeout_s=timeout,
        memory_limit=memory_limit,
        sample_hz=sample_hz,
        requires_gpu=requires_gpu,
        min_growth_mib=min_growth,
        min_growth_fraction=min_growth_fraction,
        reuse_verdicts=reuse,
    )
    payload = request.model_dump(mode="json")
    err = Console(stderr=True)
    client = make_client(server, token)
    with client, api_errors():
        created = client.submit(payload)
        job_id, url = created["id"], created["url"]
        if not wait:
            if json_:
                typer.echo(json.dumps(created))
            else:
                typer.echo(url)
            raise typer.Exit(0)
        if not json_:
            err.print(f"job {job_id}: {url}")
        try:
            report = wait_for(client, job_id, err, json_)
            curves = {} if json_ else fetch_curves(client, report)
        except KeyboardInterrupt:
            err.print(
                f"stopped waiting; job {job_id} goes on: {url} "
                f"(`bisect-cli cancel {job_id}` stops it)"
            )
            raise typer.Exit(130) from None
        except (ApiError, ApiUnreachable) as exc:
            code = BAD_INPUT if isinstance(exc, ApiError) and exc.status < 500 else INTERNAL
            fail(f"{exc} (job {job_id} may still be running: {url})", code)
    # The same report as `bisect-cli run --json`: the server's extras are not part of it.
    for key in ("progress", "created_at", "finished_at"):
        report.pop(key, None)
    print_report(report, curves, json_)
