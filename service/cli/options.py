"""Command-line options: the job's derived from `service.options.JobOptions`, the rest here.

`with_job_options(command)` gives a command one Typer option per job option that offers
that command, with the flag, help text and default the field declares; the command takes
them as ``**options`` and turns them into a `JobCreate` with `job_request`. So `run` and
`submit` never restate an option, and a new option appears on both by itself.
"""

import inspect
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from engine import baseenv
from service.cli.errors import fail, validation_message
from service.options import ENVIRONMENT, OUTPUT, WHAT, cli_of, file_options, option_fields
from service.schemas import JobCreate

F = TypeVar("F", bound=Callable[..., Any])

# Options whose command-line form is text the CLI converts (the field validates the result).
TEXT_ON_CLI = {"memory_limit", "variables"}

Script = Annotated[Path | None, typer.Argument(help="The repro script.", show_default=False)]
Range = Annotated[
    str | None,
    typer.Option(
        "--range",
        metavar="GOOD..BAD",
        rich_help_panel=WHAT,
        help="GOOD..BAD, both ends included (with --find-fix: OLD..NEW, OLD leaks).",
    ),
]
RequirementsFile = Annotated[
    Path | None,
    typer.Option(
        "--requirements",
        "-r",
        metavar="FILE",
        rich_help_panel=ENVIRONMENT,
        help="File of further requirements.",
    ),
]
Json = Annotated[
    bool,
    typer.Option("--json", rich_help_panel=OUTPUT, help="Print one JSON object on stdout."),
]


def no_password_on_argv(
    ctx: typer.Context, param: typer.CallbackParam, value: str | None
) -> str | None:
    """Refuse a --database-url whose password was typed on the command line: every user of
    the machine (and a trial) reads argv in /proc/PID/cmdline. From the environment it is
    taken (a process's environment is readable by its own uid and root only)."""
    # By name: Typer may carry its own copy of click's ParameterSource.
    source = ctx.get_parameter_source(param.name or "")
    if not value or getattr(source, "name", None) != "COMMANDLINE":
        return value
    try:
        # Here, not at the top: the client commands offer the flag without the server extra
        # (a local database needs it; service/cli/source.py says so when it is missing).
        from sqlalchemy.engine import make_url

        password = make_url(value).password
    except Exception:  # noqa: BLE001 - a URL that does not parse is reported when opened
        return value
    if password:
        fail(
            "--database-url: a password on the command line is readable by every user "
            "(/proc/PID/cmdline); set env BISECT_DATABASE_URL, or keep the password in "
            "~/.pgpass or PGPASSWORD"
        )
    return value


DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="BISECT_DATABASE_URL",
        metavar="URL",
        rich_help_panel=OUTPUT,
        callback=no_password_on_argv,
        help="Where results go (default: SQLite in the per-user data folder, 0600). A "
        "password is refused here (argv is readable by every user): use env "
        "BISECT_DATABASE_URL.",
    ),
]


def _cli_type(name: str, info: FieldInfo) -> Any:
    """The Python type Typer parses the option as."""
    annotation = info.annotation
    if name in TEXT_ON_CLI:
        return list[str] | None if get_origin(annotation) is dict else str | None
    if get_origin(annotation) is list:
        return list[str] | None
    if get_origin(annotation) in (Union, types.UnionType):
        return annotation  # X | None
    if info.default is None or info.is_required():
        return annotation | None
    return annotation


def _typer_option(name: str, info: FieldInfo) -> Any:
    cli = cli_of(info)
    assert cli is not None
    flag = cli["flag"]
    decls = [flag] if flag.count("--") == 2 else flag.split("/")
    bounds: dict[str, Any] = {}
    for meta in [] if name in TEXT_ON_CLI else info.metadata:
        if (ge := getattr(meta, "ge", None)) is not None:
            bounds["min"] = ge
        if (le := getattr(meta, "le", None)) is not None:
            bounds["max"] = le
    return typer.Option(
        *decls,
        help=info.description,
        metavar=cli["metavar"],
        rich_help_panel=cli["panel"],
        **bounds,
    )


def job_option_params(command: str) -> list[inspect.Parameter]:
    """One keyword parameter per job option offered by `command`, in definition order."""
    params = []
    for name, info in option_fields(command).items():
        # Lists and required fields start as None on the CLI (job_request fills them in or
        # names what is missing); everything else starts at the field's default.
        default = info.default
        if info.default_factory is not None or info.is_required() or name in TEXT_ON_CLI:
            default = None
        annotation = Annotated[_cli_type(name, info), _typer_option(name, info)]
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return params


def keyword(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    """A keyword-only parameter of a command, as Typer reads it (the option in `annotation`)."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def own_params(func: Callable[..., Any], *leave_out: str) -> list[inspect.Parameter]:
    """`func`'s own parameters as keyword-only ones, less ``**kwargs`` and the named ones."""
    return [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(func).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD and p.name not in leave_out
    ]


def set_params(func: F, params: list[inspect.Parameter]) -> F:
    """Give a command these parameters: Typer reads its signature and its annotations."""
    signature = inspect.signature(func)
    func.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    func.__annotations__ = {
        **{p.name: p.annotation for p in params},
        "return": signature.return_annotation,
    }
    return func


def with_job_options(command: str) -> Callable[[F], F]:
    """Add SCRIPT, --range, the job options and -r to a Typer command.

    The command takes them as ``**options`` (``script``, ``range_``, ``requirements_file``
    and one entry per job option) and hands them to `job_request`; its own parameters
    are listed after them.
    """

    def decorate(func: F) -> F:
        params = [
            keyword("script", Script),
            keyword("range_", Range),
            *job_option_params(command),
            keyword("requirements_file", RequirementsFile),
            *own_params(func),
        ]
        return set_params(func, params)

    return decorate


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


# Options naming a file of pins that the CLI reads: the field, its flag and its name field.
ENV_FILES = file_options()


def read_env_file(flag: str, path: Path) -> str:
    """An environment file's text (the field checks it; past 1 MiB it says so)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(baseenv.MAX_BYTES + 1)
    except OSError as exc:
        fail(f"{flag}: cannot read {path}: {exc.strerror}")
    try:
        return data.decode()
    except UnicodeDecodeError:
        fail(f"{flag}: {path} is not UTF-8 text")


def parse_variables(items: list[str] | None) -> dict[str, str]:
    """``--env KEY=VALUE`` items -> a mapping; one-line error for a malformed item."""
    variables: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--env: {item!r} is not KEY=VALUE")
        variables[key] = value
    return variables


def build_request(script: Path, range_: str, **fields: Any) -> JobCreate:
    if not script.is_file():
        fail(f"SCRIPT: {script} does not exist or is not a file")
    try:
        return JobCreate(range=range_, script=script.read_text(), script_name=script.name, **fields)
    except ValidationError as exc:
        fail(validation_message(exc))


def job_request(
    options: dict[str, Any], *, build: Callable[..., JobCreate] = build_request
) -> JobCreate:
    """The `JobCreate` of a command's ``**options``; bad input fails with one line."""
    options = dict(options)
    script: Path | None = options.pop("script", None)
    range_: str | None = options.pop("range_", None)
    requirements_file: Path | None = options.pop("requirements_file", None)
    if script is None:
        fail("SCRIPT: missing; give a repro script, or --example for the bundled one")
    if options.get("from_env") is None and options.get("to_env") is None:
        # With --from/--to the package and its range come out of the two environments.
        if not options.get("package"):
            fail("--package: missing; name the package whose releases to bisect")
        if not range_:
            fail("--range: missing; write GOOD..BAD, e.g. 0.11.8..0.11.19")
    fields = {k: v for k, v in options.items() if v is not None}
    requirements = list(fields.pop("requirements", []))
    if requirements_file is not None:
        requirements += read_requirements(requirements_file)
    if "variables" in fields:
        fields["variables"] = parse_variables(fields["variables"])
    for name, (flag, name_field) in ENV_FILES.items():
        if name in fields:
            path = Path(fields[name])
            fields[name], fields[name_field] = read_env_file(flag, path), path.name
    return build(script, range_ or "", requirements=requirements, **fields)


__all__ = [
    "DatabaseUrl",
    "Json",
    "Range",
    "RequirementsFile",
    "Script",
    "job_request",
    "keyword",
    "own_params",
    "set_params",
    "with_job_options",
]
