"""`bisect-cli ci`: a CI step in one command: submit, wait, job summary, outputs, one pull
request comment, and the exit status the user chose for the outcome.

Rules, in code order:

1. Options: submit's (SCRIPT, --range, every job option, --server, --token-file) and the
   step's own. Everything typed is checked before anything is sent: a bad --exit-on,
   --comment-key, or a --summary / --outputs file that cannot be written fails in one line,
   exit 2.
2. The API token: --token-file or BISECT_TOKEN as for submit; without one and with
   --oidc-audience, the CI job's OIDC identity token (service/cli/forge.py), sent as the
   bearer like any token.
3. Submit (or, with --job, follow a job submitted earlier) and wait as `submit --wait` does
   (progress on stderr); then read the report and its Markdown (GET /jobs/{id}/report.md).
4. The Markdown is appended to the job summary (--summary, default $GITHUB_STEP_SUMMARY).
   The outputs (status, first-bad and last-good, or first-good and last-bad for --find-fix,
   job-id, job-url: the job's page) go to --outputs (default $GITHUB_OUTPUT): in GitHub's
   ``name=value`` form on GitHub, else as a dotenv file for GitLab's ``artifacts: reports:
   dotenv:`` (``LEAKBISECT_STATUS=found``, ...). An output with no value is not written.
5. With --comment: one comment on the pull / merge request, edited in place on re-runs
   (forge.py). One that cannot be posted is one warning line; the result stands.
6. The text report goes to stdout; the exit status is the outcome's: `bisect-cli run`'s
   (`OUTCOME_STATUS`: 0 found, 3 bounds_failed, 4 inconclusive, 1 error or cancelled) unless
   --exit-on maps it. Before there is a report: 2 bad input or a refused request, 1 a server
   or identity endpoint that does not answer, 130 interrupted (the job goes on).
"""

import os
import re
import uuid
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from contract.errors import LeakbisectError
from contract.wire import API_PREFIX
from runners.client import ApiClient
from service.cli.display import render_report
from service.cli.errors import INTERNAL, OUTCOME_STATUS, fail, fail_with
from service.cli.forge import Forge, check_key, comment_api, detect, identity_token, upsert_comment
from service.cli.options import job_request, with_job_options
from service.cli.remote import DEFAULT_SERVER, ArgvToken, Server, Token, api_errors, make_client
from service.cli.submit import following, wait_for
from service.schemas import JobCreated, JobPublic, Report

DOTENV_PREFIX = "LEAKBISECT_"
PANEL = "The CI step"
COMMENT_MAX = 60_000  # room for the marker and the footer under the forges' 65,536

FollowJob = Annotated[
    int | None,
    typer.Option(
        "--job",
        min=1,
        metavar="ID",
        help="Follow and report a job submitted earlier (by `bisect-cli submit`) instead of "
        "submitting SCRIPT.",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
OidcAudience = Annotated[
    str | None,
    typer.Option(
        "--oidc-audience",
        envvar="BISECT_OIDC_AUDIENCE",
        metavar="AUD",
        help="Without an API token: authenticate with the CI job's OIDC identity token for "
        "this audience (GitHub: needs `permissions: id-token: write`; GitLab: from "
        "--oidc-token-env).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
OidcTokenEnv = Annotated[
    str,
    typer.Option(
        "--oidc-token-env",
        metavar="NAME",
        help="GitLab: the variable the job's `id_tokens:` fills with the identity token.",
        rich_help_panel=PANEL,
    ),
]
ForgeOption = Annotated[
    Forge,
    typer.Option(
        "--forge",
        metavar="CI",
        help="The CI: github, gitlab, none, or auto (GITHUB_ACTIONS / GITLAB_CI say).",
        rich_help_panel=PANEL,
    ),
]
Summary = Annotated[
    Path | None,
    typer.Option(
        "--summary",
        envvar="GITHUB_STEP_SUMMARY",
        metavar="FILE",
        help="Append the Markdown report to FILE (default: $GITHUB_STEP_SUMMARY).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
Outputs = Annotated[
    Path | None,
    typer.Option(
        "--outputs",
        envvar="GITHUB_OUTPUT",
        metavar="FILE",
        help="Append the outputs (status, first-bad, last-good, job-id, job-url) to FILE "
        "(default: $GITHUB_OUTPUT): GitHub's form on GitHub, else dotenv (LEAKBISECT_STATUS=...).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
Comment = Annotated[
    bool,
    typer.Option(
        "--comment/--no-comment",
        help="Post the report as one pull / merge request comment, edited in place on "
        "re-runs (token: env GITHUB_TOKEN or GITLAB_TOKEN).",
        rich_help_panel=PANEL,
    ),
]
CommentKey = Annotated[
    str | None,
    typer.Option(
        "--comment-key",
        metavar="KEY",
        help="Which comment is this bisection's, for several in one pull request "
        "(default: the package's name).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
PullRequest = Annotated[
    int | None,
    typer.Option(
        "--pr",
        min=1,
        metavar="N",
        help="The pull / merge request to comment on (default: the CI event's).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
ExitOn = Annotated[
    list[str] | None,
    typer.Option(
        "--exit-on",
        metavar="OUTCOME=STATUS",
        help="Exit with STATUS for OUTCOME (found, bounds_failed, inconclusive, error, "
        "cancelled), e.g. found=1 to fail the build on a leak; repeat or comma-separate. "
        "Default: run's (0 found, 3 bounds_failed, 4 inconclusive, 1 error or cancelled).",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]


def parse_exit_on(items: list[str] | None) -> dict[str, int]:
    """OUTCOME_STATUS with the user's ``OUTCOME=STATUS`` items applied."""
    statuses = dict(OUTCOME_STATUS)
    for item in (i for text in items or [] for i in re.split(r"[,\s]+", text) if i):
        outcome, sep, code = item.partition("=")
        if outcome not in statuses:
            fail(f"--exit-on: {outcome!r} is not an outcome; allowed: {', '.join(statuses)}")
        if not sep or not code.isdigit() or int(code) > 255:
            fail(f"--exit-on: {item!r}: the status must be a whole number 0 to 255")
        statuses[outcome] = int(code)
    return statuses


def writable(flag: str, path: Path | None) -> Path | None:
    """`path`, once it opens for appending (created when missing): fail now, not after the
    bisection."""
    if path is not None:
        try:
            path.open("a").close()
        except OSError as exc:
            fail(f"{flag}: cannot write {path}: {exc.strerror or exc}")
    return path


def bearer(token: str | None, forge: Forge, audience: str | None, variable: str) -> str | None:
    """The API token, else the CI's identity token when an audience is given (rule 2)."""
    if token or not audience:
        return token
    try:
        return identity_token(forge, audience, variable)
    except LeakbisectError as exc:
        fail_with(exc)


def page_of(client: ApiClient, job_id: int) -> str:
    """A job's status page on the server's site (where `JobCreated.page_url` points)."""
    return f"{client.base_url.removesuffix(API_PREFIX)}/jobs/{job_id}"


def start(client: ApiClient, job: int | None, payload: dict[str, Any] | None) -> tuple[int, str]:
    """The job to follow and its page: `job` (read once, so that a wrong id or token fails
    here in one line), else the one submitted."""
    if job is not None:
        client.get_job(job)
        return job, page_of(client, job)
    created = JobCreated.model_validate(client.submit(payload or {}))
    return created.id, created.page_url


def finish(client: ApiClient, job_id: int, page: str, err: Console) -> tuple[JobPublic, str]:
    """Wait for the job; its report and the report's Markdown."""
    with following(job_id, page, err):
        report = JobPublic.model_validate(wait_for(client, job_id, err))
        markdown = client.request("GET", f"/jobs/{job_id}/report.md").text
    return report, markdown


def outputs_of(report: Report, job_id: int, page: str) -> dict[str, str]:
    """The step's outputs; the pair under the job's own names (first-bad or first-good)."""
    last, first = (name.replace("_", "-") for name in report.names)
    return {
        "status": report.status,
        first: report.first_new or "",
        last: report.last_old or "",
        "job-id": str(job_id),
        "job-url": page,
    }


def output_lines(values: dict[str, str], forge: Forge) -> str:
    """GitHub's ``name=value`` (a heredoc for a value on several lines), else dotenv."""
    lines = []
    for name, value in values.items():
        if not value:
            continue
        if forge is not Forge.GITHUB:
            key = DOTENV_PREFIX + name.upper().replace("-", "_")
            lines.append(f"{key}={' '.join(value.split())}\n")
        elif "\n" in value or "\r" in value:
            delimiter = f"ghadelimiter_{uuid.uuid4()}"
            lines.append(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
        else:
            lines.append(f"{name}={value}\n")
    return "".join(lines)


def append(path: Path | None, text: str) -> None:
    if path is not None:
        with path.open("a") as fh:
            fh.write(text)


def comment_text(markdown: str, key: str, page: str) -> str:
    """The comment: the report, cut at a line to fit a comment (both forges take 65,536
    characters at most) with a link to the whole, and which commit it was made for."""
    if len(markdown) > COMMENT_MAX:
        kept = markdown[:COMMENT_MAX].rsplit("\n", 1)[0]
        markdown = f"{kept}\n\n_Cut to fit a comment: the whole report is on [its page]({page})._\n"
    commit = os.environ.get("GITHUB_SHA") or os.environ.get("CI_COMMIT_SHA") or ""
    footer = f"\n\n<sub>leakbisect ({key}) for commit {commit[:12]}</sub>\n" if commit else ""
    return markdown + footer


def post_comment(forge: Forge, pr: int | None, key: str, text: str) -> None:
    """The one comment of `key`, posted or edited; a failure is one warning line."""
    try:
        api = comment_api(forge, os.environ, pr)
        done, comment_id = upsert_comment(api, key, text)
    except LeakbisectError as exc:
        typer.echo(f"warning: comment not posted: {exc}; the result stands", err=True)
        return
    typer.echo(f"comment {comment_id} {done} ({key})", err=True)


def default_key(options: dict[str, Any], report: Report) -> str:
    return options.get("package") or report.package or "leakbisect"


@with_job_options("submit")
def ci(
    job: FollowJob = None,
    server: Server = DEFAULT_SERVER,
    token: Token = None,
    argv_token: ArgvToken = None,
    oidc_audience: OidcAudience = None,
    oidc_token_env: OidcTokenEnv = "BISECT_ID_TOKEN",
    forge: ForgeOption = Forge.AUTO,
    summary: Summary = None,
    outputs: Outputs = None,
    comment: Comment = False,
    comment_key: CommentKey = None,
    pr: PullRequest = None,
    exit_on: ExitOn = None,
    **options: Any,
) -> NoReturn:
    """Bisect from CI in one step: submit, wait, job summary, outputs, one PR comment.

    Exit status: the outcome's, run's by default (0 found, 3 a bound failed its check,
    4 inconclusive, 1 error or cancelled), or as --exit-on maps it. Before a report:
    2 bad input or a request the server refused (HTTP 4xx), 1 a server or identity
    endpoint that does not answer, 130 interrupted (the job goes on).
    """
    statuses = parse_exit_on(exit_on)
    where = detect(forge, os.environ)
    try:
        key = check_key(comment_key) if comment_key else None
    except LeakbisectError as exc:
        fail_with(exc)
    summary, outputs = writable("--summary", summary), writable("--outputs", outputs)
    payload = None
    if job is None:
        if options.get("script") is None:
            fail("SCRIPT: missing; give the repro script to run, or --job ID")
        payload = job_request(options).model_dump(mode="json")
    elif options.get("script") is not None:
        fail("--job: follows a job submitted earlier; drop SCRIPT")
    err = Console(stderr=True)
    with make_client(server, bearer(token, where, oidc_audience, oidc_token_env)) as client:
        with api_errors():
            job_id, page = start(client, job, payload)
        typer.echo(f"job {job_id}: {page}", err=True)
        report, markdown = finish(client, job_id, page, err)
    append(summary, markdown if markdown.endswith("\n") else markdown + "\n")
    append(outputs, output_lines(outputs_of(report, job_id, page), where))
    if comment:
        key = key or default_key(options, report)
        post_comment(where, pr, key, comment_text(markdown, key, page))
    render_report(Console(), report.report(), {})
    raise typer.Exit(statuses.get(report.status, INTERNAL))
