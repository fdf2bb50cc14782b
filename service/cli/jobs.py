"""`bisect-cli status | list | cancel | logs | report`: read and steer jobs on a server
(`report --local`: a `bisect-cli run` result in the local database).

Each prints a short human form, or with --json the server's JSON unchanged.
Exit status: 0 when the server answered, 2 for a refused request (HTTP 4xx:
no such job, finished already, bad token), 1 when the server is unreachable.
"""

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.cli.display import render_report
from service.cli.errors import fail
from service.cli.options import DatabaseUrl, Json
from service.cli.remote import DEFAULT_SERVER, Server, Token, api_errors, make_client
from service.markdown import markdown_report
from service.report import Report
from service.text import printable

JobId = Annotated[int, typer.Argument(help="The job's id (from submit or list).", min=1)]
TrialId = Annotated[int, typer.Argument(help="The trial's id (from status --json).", min=1)]


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, default=str))


def _progress_line(report: dict[str, Any]) -> str:
    p = report.get("progress") or {}
    return (
        f"job {report['job_id']} {report['status']}: {p.get('judged', 0)}/"
        f"{p.get('candidates', 0)} candidates judged; trials {p.get('trials_done', 0)} done, "
        f"{p.get('trials_running', 0)} running, {p.get('trials_queued', 0)} queued"
    )


def status(
    job: JobId,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    json_: Json = False,
) -> None:
    """Show a job: status, progress, candidates with verdicts and, once found, the result."""
    with make_client(server, token) as client, api_errors():
        report = client.get_job(job)
    if json_:
        _echo_json(report)
        return
    console = Console()
    console.print(_progress_line(report))
    render_report(console, Report.model_validate(report), {})


def _result(item: dict[str, Any]) -> str:
    result = item.get("result") or {}
    if item["status"] == "found":
        old, new = result.get("last_old"), result.get("first_new")
        return f"{'first good' if item['find_fix'] else 'first bad'} {new} (after {old})"
    return (item.get("message") or "").splitlines()[0] if item.get("message") else ""


def list_jobs(
    status_: Annotated[
        str | None,
        typer.Option(
            "--status",
            help="Only jobs with this status: queued, running, found, bounds_failed, "
            "inconclusive, error, cancelled.",
        ),
    ] = None,
    package: Annotated[str | None, typer.Option("--package", "-p", help="Only this package.")] = (
        None
    ),
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="Jobs per page.")] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Jobs to skip.")] = 0,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    json_: Json = False,
) -> None:
    """List jobs, newest first."""
    with make_client(server, token) as client, api_errors():
        page = client.list_jobs(status=status_, package=package, limit=limit, offset=offset)
    if json_:
        _echo_json(page)
        return
    table = Table(title=f"jobs ({page['total']} in all)", title_justify="left")
    for name in ("id", "status", "package", "range", "created", "result"):
        table.add_column(name)
    for item in page["items"]:
        table.add_row(
            str(item["id"]),
            item["status"],
            item["package"],
            item["range"],
            str(item["created_at"])[:19].replace("T", " "),
            escape(printable(_result(item))),
        )
    Console().print(table)


def cancel(
    job: JobId,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    json_: Json = False,
) -> None:
    """Cancel a job: queued trials are dropped, running ones killed by their runners."""
    with make_client(server, token) as client, api_errors():
        report = client.cancel(job)
    if json_:
        _echo_json(report)
    else:
        typer.echo(f"job {job} cancelled")


def logs(
    trial: TrialId,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    json_: Json = False,
) -> None:
    """Print a trial's log tail (the end of the script's output) after a summary line."""
    with make_client(server, token) as client, api_errors():
        info = client.get_trial(trial)
    if json_:
        _echo_json(info)
        return
    parts = [f"attempt {info['attempt']}"]
    if info.get("runner_id"):
        parts.append(f"runner {info['runner_id']}")
    if info.get("exit_code") is not None:
        parts.append(f"exit {info['exit_code']}")
    if info.get("duration_s") is not None:
        parts.append(f"{info['duration_s']:.1f}s")
    if info.get("oom_killed"):
        parts.append("OOM-killed")
    if info.get("timed_out"):
        parts.append("timed out")
    verdict = f", {info['verdict']}" if info.get("verdict") else ""
    typer.echo(
        f"trial {trial} (job {info['job_id']}, {info['version']}): "
        f"{info['status']}{verdict}; {', '.join(parts)}",
        err=True,
    )
    if info.get("error"):
        typer.echo(f"error: {printable(info['error'])}", err=True)
    # The script's own output: whatever it printed must not reach the terminal as control.
    tail = printable(info.get("log_tail") or "")
    typer.echo(tail, nl=not tail.endswith("\n"))


Markdown = Annotated[
    bool,
    typer.Option("--markdown", help="Print the report as Markdown, ready for an upstream issue."),
]
Local = Annotated[
    bool,
    typer.Option(
        "--local",
        help="Read a `bisect-cli run` result from the results database (--database-url) "
        "instead of asking a server.",
    ),
]


def _local_report(job_id: int, database_url: str | None) -> tuple[Report, dict[int, list[float]]]:
    from sqlmodel import Session

    from runners.errors import LeakbisectError
    from service import store
    from service.cli.db import shown
    from service.cli.errors import fail_with
    from service.cli.run import curves_for
    from service.db import get_engine
    from service.report import build_report
    from service.settings import get_settings

    url = database_url or get_settings().effective_database_url
    try:
        with Session(get_engine(url)) as session:
            found = store.job(session, job_id)
            report = build_report(
                found, store.candidates_of(session, found), store.trials_of(session, found)
            )
            return report, curves_for(session, report)
    except LeakbisectError as exc:
        fail_with(exc)
    except Exception as exc:  # noqa: BLE001 - a driver error is one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"--database-url: cannot read {shown(url)}: {first}")


def report(
    job: JobId,
    markdown: Markdown = False,
    local: Local = False,
    database_url: DatabaseUrl = None,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    json_: Json = False,
) -> None:
    """Print a job's report: the text report, --json, or --markdown to paste upstream.

    Exit status: 0 printed, 2 no such job or a refused request, 1 server unreachable.
    """
    if markdown and json_:
        fail("--markdown: choose --markdown or --json, not both")
    if local:
        result, curves = _local_report(job, database_url)
        if markdown:
            typer.echo(markdown_report(result), nl=False)
        elif json_:
            _echo_json(result.wire())
        else:
            render_report(Console(), result, curves)
        return
    with make_client(server, token) as client, api_errors():
        if markdown:
            typer.echo(client.request("GET", f"/jobs/{job}/report.md").text, nl=False)
            return
        data = client.get_job(job)
    if json_:
        _echo_json(data)
    else:
        render_report(Console(), Report.model_validate(data), {})
