"""`bisect-cli run`: bisect locally, with no server."""

import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from sqlmodel import Session, col, select

from runners.envs import EnvError, find_python
from runners.machine import describe_machine
from runners.nvml import GpuProbe
from runners.trial import LocalExecutor
from service.cli import options as o
from service.cli.display import LineProgress, LiveDisplay, render_report
from service.cli.errors import fail, internal, validation_message
from service.db import get_engine, upgrade
from service.index import IndexUnavailable
from service.jobs import create_job
from service.local import run_job
from service.models import MemorySample
from service.releases import RangeError
from service.report import build_report, exit_code
from service.scheduler import candidates_of, trials_of
from service.schemas import JobCreate
from service.settings import get_settings

EXAMPLE = Path(__file__).resolve().parents[1] / "example"


def read_requirements(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        fail(f"-r: cannot read {path}: {exc.strerror}")
    return [
        line.split(" #", 1)[0].strip()
        for line in lines
        if line.strip() and not line.startswith("#")
    ]


def build_request(script: Path, package: str, range_: str, **fields: Any) -> JobCreate:
    if not script.is_file():
        fail(f"SCRIPT: {script} does not exist or is not a file")
    try:
        return JobCreate(
            package=package,
            range=range_,
            script=script.read_text(),
            script_name=script.name,
            **fields,
        )
    except ValidationError as exc:
        fail(validation_message(exc))


def job_request(
    script: Path | None,
    package: str | None,
    range_: str | None,
    *,
    with_: list[str] | None,
    requirements_file: Path | None,
    **fields: Any,
) -> JobCreate:
    """The `JobCreate` of the shared run options (`run` and `submit`); bad input fails."""
    if script is None:
        fail("SCRIPT: missing; give a repro script, or --example for the bundled one")
    if not package:
        fail("--package: missing; name the package whose releases to bisect")
    if not range_:
        fail("--range: missing; write GOOD..BAD, e.g. 0.11.8..0.11.19")
    reqs = list(with_ or [])
    if requirements_file is not None:
        reqs += read_requirements(requirements_file)
    return build_request(script, package, range_, requirements=reqs, **fields)


def print_report(report: dict[str, Any], curves: dict[int, list[float]], json_: bool) -> NoReturn:
    """The final report (JSON or Rich) and the exit status of its job status."""
    if json_:
        typer.echo(json.dumps(report, default=str))
    else:
        render_report(Console(), report, curves)
    raise typer.Exit(exit_code(report["status"]))


def curves_for(session: Session, report: dict[str, Any]) -> dict[int, list[float]]:
    ids = [run["trial"] for item in report["evidence"] for run in item["runs"]]
    curves: dict[int, list[float]] = {i: [] for i in ids}
    query = (
        select(MemorySample)
        .where(col(MemorySample.trial_id).in_(ids))
        .order_by(col(MemorySample.id))
    )
    for sample in session.exec(query):
        curves[sample.trial_id].append(float(sample.rss))
    return curves


def run(
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
    min_growth: o.MinGrowth = None,
    min_growth_fraction: o.MinGrowthFraction = None,
    reuse: o.Reuse = True,
    json_: o.Json = False,
    database_url: o.DatabaseUrl = None,
    example: Annotated[
        bool,
        typer.Option(
            "--example",
            help="Bisect the bundled offline example: synthetic leakyfixture releases served "
            "on 127.0.0.1, first leaking release 1.0.6.",
        ),
    ] = False,
) -> None:
    """Bisect a release range locally and report the first leaking release.

    Exit status: 0 found, 3 a bound failed its check, 4 inconclusive, 2 bad input,
    1 internal error.
    """
    settings = get_settings()
    err = Console(stderr=True)
    with ExitStack() as stack:
        if example:
            from service.example.fixture import build_fixture
            from service.example.index import serve_index

            wheels = build_fixture(settings.cache_dir / "example-index")
            index_url = stack.enter_context(serve_index(wheels))
            script = script or EXAMPLE / "repro.py"
            package = package or "leakyfixture"
            range_ = range_ or "1.0.0..1.0.9"
            if not json_:
                err.print(f"example: leakyfixture releases served at {index_url}")
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
            min_growth_mib=min_growth,
            min_growth_fraction=min_growth_fraction,
            reuse_verdicts=reuse,
        )
        try:
            find_python(request.python)
        except EnvError as exc:
            fail(f"--python: {exc}")
        url = database_url or settings.effective_database_url
        try:
            upgrade(url)
        except Exception as exc:  # noqa: BLE001 - any driver error is one line for the user
            fail(f"--database-url: cannot open {url}: {str(exc).splitlines()[0]}")
        engine = get_engine(url)
        gpu = GpuProbe.open()
        with Session(engine) as session:
            try:
                job = create_job(
                    session,
                    request,
                    machine=describe_machine(gpu),
                    cache_dir=settings.uv_cache_dir,
                )
            except RangeError as exc:
                fail(f"--range: {exc}")
            except IndexUnavailable as exc:
                fail(str(exc))
            candidates = candidates_of(session, job)
            if sys.stderr.isatty():
                display: Any = stack.enter_context(LiveDisplay(err, candidates, job.package))
            else:
                display = LineProgress(err)
            if not json_:
                err.print(f"job {job.id}: {len(candidates)} candidates, results in {url}")
            try:
                run_job(
                    session,
                    job,
                    executor=LocalExecutor(settings.env_root, settings.uv_cache_dir, gpu),
                    progress=display,
                )
            except KeyboardInterrupt:
                err.print("interrupted: job cancelled")
                raise typer.Exit(130) from None
            except Exception as exc:  # noqa: BLE001
                internal(exc)
            report = build_report(job, candidates_of(session, job), trials_of(session, job))
            curves = {} if json_ else curves_for(session, report)
    print_report(report, curves, json_)
