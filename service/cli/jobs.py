"""`bisect-cli status | list | cancel | logs | report`: read and steer jobs.

`status`, `list`, `logs` and `report` read a server when one is named (`--server` or
`BISECT_SERVER`), else the local results database that `bisect-cli run` writes
(service/cli/source.py); `cancel` always asks a server. Each prints a short human form, or
with --json the API's JSON. The answer is read into the API's models (service/schemas.py)
once, where it arrives; everything printed reads those. Exit status: 0 answered, 2 a
refused request or no such job (HTTP 4xx), 1 a server that cannot be reached or a database
that cannot be read.
"""

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.cli.display import render_report
from service.cli.errors import fail
from service.cli.options import DatabaseUrl, Json, keyword, own_params, set_params
from service.cli.remote import DEFAULT_SERVER, ArgvToken, Server, Token, api_errors, make_client
from service.cli.source import Source, open_source
from service.schemas import JobPublic, JobSummary
from service.text import printable

ReadServer = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="Read from this leakbisect server (env BISECT_SERVER); without either, the "
        "local results database that `bisect-cli run` writes (--database-url).",
        show_default=False,
    ),
]
JobId = Annotated[int, typer.Argument(help="The job's id (from submit or list).", min=1)]
TrialNumber = Annotated[
    int, typer.Argument(help="The trial's number in the job: 1, 2, ... (as status shows).", min=1)
]
M = TypeVar("M", bound=BaseModel)


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, default=str))


@dataclass(frozen=True)
class ReadFrom:
    """Where a reading command reads (a server, else the local database) and whether it
    prints the answer as JSON: the options `reads` gives every reading command."""

    server: str | None
    token: str | None
    database_url: str | None
    json: bool

    @contextmanager
    def source(self, *, local: bool = False) -> Iterator[Source]:
        with open_source(self.server, self.token, self.database_url, local=local) as source:
            yield source

    def answer(self, ask: Callable[[Source], M]) -> M | None:
        """What `ask` reads (one of the API's models); None once it is printed as the API's
        JSON (--json)."""
        with self.source() as source:
            answer = ask(source)
        if self.json:
            _echo_json(answer.model_dump(mode="json"))
            return None
        return answer


# After a reading command's own parameters: --server, --token-file, --token (refused by its
# callback), --database-url, --json.
READ_OPTIONS = [
    keyword("server", ReadServer),
    keyword("token", Token),
    keyword("argv_token", ArgvToken),
    keyword("database_url", DatabaseUrl),
    keyword("json_", Json, False),
]


def reads(func: Callable[..., None]) -> Callable[..., None]:
    """Give a reading command the READ_OPTIONS; it takes them as one ``read: ReadFrom``."""

    @functools.wraps(func)
    def command(**options: Any) -> None:
        del options["argv_token"]  # its callback has refused any value
        read = ReadFrom(
            options.pop("server"),
            options.pop("token"),
            options.pop("database_url"),
            options.pop("json_"),
        )
        func(**options, read=read)

    return set_params(command, [*own_params(func, "read"), *READ_OPTIONS])


def _progress_line(report: JobPublic) -> str:
    p = report.progress
    return (
        f"job {report.job_id} {report.status}: {p.judged}/{p.candidates} candidates judged; "
        f"trials {p.trials_done} done, {p.trials_running} running, {p.trials_queued} queued"
    )


@reads
def status(job: JobId, *, read: ReadFrom) -> None:
    """Show a job: status, progress, candidates with verdicts and, once found, the result."""
    public = read.answer(lambda source: source.get_job(job))
    if public is None:
        return
    console = Console()
    console.print(_progress_line(public))
    render_report(console, public, {})


def _result(item: JobSummary) -> str:
    result = item.result or {}
    if item.status == "found":
        old, new = result.get("last_old"), result.get("first_new")
        return f"{'first good' if item.find_fix else 'first bad'} {new} (after {old})"
    return item.message.splitlines()[0] if item.message else ""


@reads
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
    *,
    read: ReadFrom,
) -> None:
    """List jobs, newest first."""
    page = read.answer(
        lambda source: source.list_jobs(status=status_, package=package, limit=limit, offset=offset)
    )
    if page is None:
        return
    table = Table(title=f"jobs ({page.total} in all)", title_justify="left")
    for name in ("id", "status", "package", "range", "created", "result"):
        table.add_column(name)
    for item in page.items:
        table.add_row(
            str(item.id),
            item.status,
            item.package,
            item.range,
            item.created_at.isoformat(sep=" ")[:19],
            escape(printable(_result(item))),
        )
    Console().print(table)


def cancel(
    job: JobId,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    argv_token: ArgvToken = None,
    json_: Json = False,
) -> None:
    """Cancel a job: queued trials are dropped, running ones killed by their runners."""
    with make_client(server, token) as client, api_errors():
        report = client.cancel(job)
    if json_:
        _echo_json(report)
    else:
        typer.echo(f"job {job} cancelled")


@reads
def logs(job: JobId, trial: TrialNumber, *, read: ReadFrom) -> None:
    """Print a trial's log tail (the end of the script's output) after a summary line."""
    info = read.answer(lambda source: source.get_trial(job, trial))
    if info is None:
        return
    parts = [f"attempt {info.attempt}"]
    if info.runner_id:
        parts.append(f"runner {info.runner_id}")
    if info.exit_code is not None:
        parts.append(f"exit {info.exit_code}")
    if info.duration_s is not None:
        parts.append(f"{info.duration_s:.1f}s")
    if info.oom_killed:
        parts.append("OOM-killed")
    if info.timed_out:
        parts.append("timed out")
    verdict = f", {info.verdict}" if info.verdict else ""
    typer.echo(
        f"trial {trial} of job {job} ({info.version}): {info.status}{verdict}; {', '.join(parts)}",
        err=True,
    )
    if info.error:
        typer.echo(f"error: {printable(info.error)}", err=True)
    # The script's own output: whatever it printed must not reach the terminal as control.
    tail = printable(info.log_tail or "")
    typer.echo(tail, nl=not tail.endswith("\n"))


Markdown = Annotated[
    bool,
    typer.Option("--markdown", help="Print the report as Markdown, ready for an upstream issue."),
]
Local = Annotated[
    bool,
    typer.Option(
        "--local",
        help="Read the local results database (--database-url) even when BISECT_SERVER is set.",
    ),
]


@reads
def report(job: JobId, markdown: Markdown = False, local: Local = False, *, read: ReadFrom) -> None:
    """Print a job's report: the text report, --json, or --markdown to paste upstream.

    Exit status: 0 printed, 2 no such job or a refused request, 1 server unreachable.
    """
    if markdown and read.json:
        fail("--markdown: choose --markdown or --json, not both")
    if local and read.server:
        fail("--local: reads the local database; drop it or --server")
    with read.source(local=local) as source:
        if markdown:
            typer.echo(source.markdown(job), nl=False)
            return
        public = source.get_job(job)
        if read.json:
            _echo_json(public.model_dump(mode="json"))
            return
        curves = source.curves(public)
    render_report(Console(), public, curves)
