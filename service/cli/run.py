"""`bisect-cli run`: bisect locally, with no server.

What the command's options need is imported here; what running a job needs (the database,
the models, the executor, the scheduler) is imported when the command runs, so
`bisect-cli run --help` stays quick (tests/test_cli_startup.py).
"""

import signal
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from contract.errors import LeakbisectError
from service.cli.db import results_database, shown
from service.cli.errors import fail, fail_with, internal
from service.cli.executor import make_executor, with_executor_options
from service.cli.options import DatabaseUrl, Json, build_request, job_request, with_job_options
from service.options import RUNS, WHAT

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlmodel import Session

    from contract.executor import Executor
    from runners.nvml import GpuProbe
    from service.models import Job
    from service.schemas import JobCreate
    from service.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[1] / "example"
EXAMPLE_PACKAGE, EXAMPLE_RANGE = "leakyfixture", "1.0.0..1.0.9"

Example = Annotated[
    bool,
    typer.Option(
        "--example",
        rich_help_panel=WHAT,
        help="Bisect the bundled offline example: synthetic leakyfixture releases served "
        "on 127.0.0.1, first leaking release 1.0.6.",
    ),
]

MAX_JOBS = 64
Jobs = Annotated[
    int,
    typer.Option(
        "--jobs",
        "-j",
        metavar="N",
        rich_help_panel=RUNS,
        help="Trials run side by side, each a capped process of its own (default cap: 80% of "
        "RAM divided by N); the range is cut into N parts. Not for repros whose timing or GPU "
        "memory another trial would disturb.",
    ),
]


def _serve_example(stack: ExitStack, settings: "Settings", quiet: bool) -> str:
    from service.example.fixture import build_fixture
    from service.example.index import serve_index

    wheels = build_fixture(settings.cache_dir / "example-index")
    index_url = stack.enter_context(serve_index(wheels))
    if not quiet:
        Console(stderr=True).print(f"example: leakyfixture releases served at {index_url}")
    return index_url


def _open_database(url: str) -> "Engine":
    from service.db import get_engine, upgrade

    try:
        upgrade(url)
    except Exception as exc:  # noqa: BLE001 - any driver error is one line for the user
        fail(f"--database-url: cannot open {shown(url)}: {str(exc).splitlines()[0]}")
    return get_engine(url)


def _create(session: "Session", request: "JobCreate", gpu: "GpuProbe | None") -> "Job":
    from runners.envs import EnvError, find_python
    from runners.machine import describe_machine
    from service.jobs import create_job

    try:
        find_python(request.python)
        return create_job(session, request, machine=describe_machine(gpu), local=True)
    except EnvError as exc:
        fail(f"--python: {exc}")
    except LeakbisectError as exc:
        fail_with(exc)


def _executor(settings: "Settings", gpu: "GpuProbe | None") -> "Executor":
    from runners.agent import default_name

    return make_executor(settings, gpu, f"run-{default_name()}")  # --executor (executor.py)


def _bisect(
    session: "Session", job: "Job", executor: "Executor", jobs: int, operator_webhook: bool
) -> None:
    from runners.limits import default_limit_bytes
    from service import store
    from service.cli.display import LineProgress, LiveDisplay
    from service.local import run_job

    # Ctrl-C (SIGINT) always ends a local run cancelled, with its trials killed, also when
    # it was started ignoring SIGINT (a background job of a non-interactive shell, as CI
    # and nohup start it): Python keeps an inherited SIG_IGN, and nothing would clean up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    err = Console(stderr=True)
    candidates = store.candidates_of(session, job)
    with ExitStack() as stack:
        if sys.stderr.isatty():
            display: Any = stack.enter_context(LiveDisplay(err, candidates, job.target.package))
        else:
            display = LineProgress(err)
        try:
            run_job(
                session,
                job,
                executor=executor,
                progress=display,
                jobs=jobs,
                memory_budget=default_limit_bytes() if jobs > 1 else None,
                operator_webhook=operator_webhook,
            )
        except KeyboardInterrupt:
            err.print("interrupted: job cancelled")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001
            internal(exc)


@with_executor_options
@with_job_options("run")
def run(
    json_: Json = False,
    database_url: DatabaseUrl = None,
    example: Example = False,
    jobs: Jobs = 1,
    **options: Any,
) -> None:
    """Bisect a release range locally and report the first leaking release.

    Exit status: 0 found (also when the range is not monotone: the report's first lines
    say which releases disagree), 3 a bound failed its check (--all-transitions: no
    transition in the range), 4 inconclusive, 2 bad input, 1 internal error or a bound that
    cannot be tested.
    """
    if not 1 <= jobs <= MAX_JOBS:
        fail(f"--jobs: {jobs} is out of range; allowed are 1 to {MAX_JOBS}")
    from sqlmodel import Session

    from runners.nvml import open_probe
    from service import store
    from service.cli.display import print_report
    from service.report import build_report
    from service.settings import get_settings
    from service.views import evidence_curves

    settings = get_settings()
    with ExitStack() as stack:
        if example:
            options["index_url"] = _serve_example(stack, settings, json_)
            options["script"] = options.get("script") or EXAMPLE / "repro.py"
            options["package"] = options.get("package") or EXAMPLE_PACKAGE
            options["range_"] = options.get("range_") or EXAMPLE_RANGE
        request = job_request(options, build=build_request)
        if request.webhook_url and settings.webhook_secret is None:
            fail(
                "--webhook: every webhook is signed; set BISECT_WEBHOOK_SECRET (32+ "
                "characters) to the secret the receiver checks"
            )
        url = results_database(database_url)
        gpu = open_probe(settings.gpu_exclusive, sharers=jobs)
        executor = _executor(settings, gpu)  # the sandbox users and directories, first
        engine = _open_database(url)
        with Session(engine) as session:
            job = _create(session, request, gpu)
            if not json_:
                what = _searched(session, job)
                Console(stderr=True).print(f"job {job.id}: {what}, results in {shown(url)}")
            _bisect(session, job, executor, jobs, settings.webhook_url is not None)
            candidates, trials = store.candidates_of(session, job), store.trials_of(session, job)
            report = build_report(job, candidates, trials)
            curves = {} if json_ else evidence_curves(session, report)
        try:
            print_report(report, curves, json_)
        finally:  # the report first: a failing receiver's retries take minutes
            _send_webhooks(engine, settings, job.id)  # type: ignore[arg-type]


def _send_webhooks(engine: "Engine", settings: "Settings", job_id: int) -> None:
    """Post the job's webhooks (its --webhook, BISECT_WEBHOOK_URL) now that it has ended,
    retrying with the service's backoff; each attempt is one line on stderr. Ctrl-C stops
    waiting (the exit status stays the job's)."""
    from sqlmodel import Session

    from service.webhooks import deliver_job

    def say(line: str) -> None:  # whole lines (a log a CI greps), never wrapped
        typer.echo(line, err=True)

    with Session(engine) as session:
        try:
            deliver_job(session, settings, job_id, say=say)
        except KeyboardInterrupt:
            say("webhook: interrupted; the attempts not made are not sent")


def _searched(session: "Session", job: "Job") -> str:
    """What the job searches, for its first line: releases, or --from/--to's changes."""
    from service import store

    if job.dependency is not None:
        changed = len(job.dependency.get("changes", []))
        return f"{changed} packages changed between --from and --to"
    return f"{len(store.candidates_of(session, job))} candidates"
