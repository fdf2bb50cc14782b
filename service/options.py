"""The options of a bisection job, each defined once.

`JobOptions` is the one definition. The API's `JobCreate` and the `Job` table both derive
from it (`Job.model_validate(request, update=...)`); `bisect-cli run` and `submit` derive
their flags, help texts and defaults from it (service/cli/options.py); error messages name
the flag it declares (`flag_names`); and the README's option table is generated from it
(`markdown_table`, checked by tests/test_docs.py); an option whose flag names a file the
CLI reads says so (`file=`, `file_options`). A new option is one `option(...)` field here
plus the code that uses it.

The environment-policy fields (`as_released`, `resolve_at`, `base_env`, `from_env`/`to_env`
and their names) stay flat on the wire and in the table, but are read as one union,
`env_policy` (service/envpolicy.py), whose module holds every rule between them: the one
validator `_env_policy` runs it. Code that acts on the policy asks the union.

`option()` is pydantic's `Field` plus where the option appears on the command line: its
flag(s) and the commands that offer it. Flags live in the field's JSON schema under
``x-cli`` (so the OpenAPI document says which flag sets a field, too).

Pure pydantic: this module is the client's too (`bisect-cli submit` builds a `JobCreate`
on an install without the server extra), so it names no table type. Where the `job`
table's column is not what the field's type says (long text, JSON, a 64-bit integer, an
index), the field carries a `Stored` note that service/models.py turns into the column.
"""

import re
from dataclasses import dataclass
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.fields import FieldInfo

from contract import outbound
from contract.wire import MIN_HORIZON_S
from engine.units import SIZE_HELP, parse_size
from service import envpolicy

MAX_SCRIPT_BYTES = 1024 * 1024
# A cap below this cannot hold a Python interpreter; above it is no cap at all.
MIN_MEMORY_LIMIT, MAX_MEMORY_LIMIT = 16 * 1024 * 1024, 1 << 50
MAX_REQUIREMENTS = 200
MAX_URLS = 20
MAX_TEXT = 2000  # a requirement, a URL
MAX_VARIABLES = 64
MAX_VARIABLE_BYTES = 4096
# A Python version a job may ask for. Whether one is installed is the runner's (or, for
# `bisect-cli run`, this machine's) to say; the API also refuses minors no CPython has.
PYTHON_VERSION = re.compile(r"3\.(?P<minor>\d{1,2})(\.\d{1,3})?")
PYTHON_MINORS = range(8, 21)
# Upper bounds of the options that multiply a job's cost (issue 26): runs per candidate
# and the length of one run. Beyond them a job is not more careful, only a way to hold the
# runners; --help and the API's schema show them, and the API refuses more (422).
MAX_REPEATS = 20
MAX_RUNS = 20
MAX_TIMEOUT_S = 24 * 3600
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
SCRIPT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.py")

RUN_AND_SUBMIT = ("run", "submit")

# The panels `--help` groups options in (service/cli/help.py): every option with a flag
# names one here; the CLI's own options (service/cli/) name theirs beside them.
WHAT = "What to bisect"
ENVIRONMENT = "Environment"
RUNS = "Runs and verdicts"
STAGES = "Stages"
OUTPUT = "Output"
EXECUTOR = "Executor"


@dataclass(frozen=True)
class Stored:
    """How the `job` table stores an option where the field's type alone does not say
    (service/models.py makes the column): as long text, JSON or a 64-bit integer, and
    whether the column is indexed. Pydantic keeps it in the field's metadata and ignores it."""

    type: Literal["text", "json", "bigint"] | None = None
    index: bool = False


def stored_of(info: FieldInfo) -> Stored | None:
    """The `Stored` note of a field, or None (the column follows the field's type)."""
    return next((meta for meta in info.metadata if isinstance(meta, Stored)), None)


def option(
    default: Any = ...,
    *,
    flag: str | None,
    help: str,
    commands: tuple[str, ...] = RUN_AND_SUBMIT,
    metavar: str | None = None,
    panel: str | None = None,
    file: str | None = None,
    verdict: bool = True,
    column: Literal["text", "json", "bigint"] | None = None,
    index: bool = False,
    **field: Any,
) -> Any:
    """A job option: `Field(...)` plus its command-line flag(s) (None: not on the CLI).

    ``flag`` is "--name", "--name/-n" for a short form, or "--on/--off" for a bool whose
    default is on. ``help`` is the one text shown by --help, the README and OpenAPI.
    ``panel``: which --help panel lists the flag (one of the titles above; required with
    a flag).
    ``file``: the flag names a file the CLI reads; the option holds its text and the field
    ``file`` its name (`file_options`).
    ``verdict=False``: the option cannot change a release's verdict. Every other option
    is in the verdict-reuse key (service/reuse.py), so a new one is keyed unless it says
    otherwise: forgetting costs reuse, never a wrong verdict.
    ``column``, ``index``: how the `job` table stores it, where its type does not say (`Stored`).
    """
    if flag and panel is None:
        raise TypeError(f"option {flag}: name its --help panel")
    cli = (
        {"flag": flag, "commands": list(commands), "metavar": metavar, "panel": panel}
        if flag
        else None
    )
    if cli and file:
        cli["file"] = file
    extra: dict[str, Any] | None = {"x-cli": cli} if cli else None
    if not verdict:
        extra = (extra or {}) | {"x-verdict": False}
    info: FieldInfo = Field(default, description=help, json_schema_extra=extra, **field)
    if column or index:
        info.metadata.append(Stored(column, index))
    return info


def cli_of(info: FieldInfo) -> dict[str, Any] | None:
    """The ``x-cli`` entry of a field: {"flag", "commands", "metavar", "panel"}, or None."""
    extra = info.json_schema_extra
    return extra.get("x-cli") if isinstance(extra, dict) else None  # type: ignore[return-value]


def changes_verdict(info: FieldInfo) -> bool:
    """Whether an option can change a release's verdict (``option(verdict=...)``)."""
    extra = info.json_schema_extra
    return not isinstance(extra, dict) or extra.get("x-verdict", True) is not False


class JobOptions(BaseModel):
    """What a bisection job is asked to do: the same from `run`, `submit` and REST."""

    # No infinities or NaNs anywhere: 1e999 as a threshold means nothing can ever leak.
    model_config = ConfigDict(allow_inf_nan=False)

    from_env_name: str | None = option(
        None, flag=None, help="The good environment's file name (says its format).", max_length=200
    )
    from_env: str | None = option(
        None,
        flag="--from",
        panel=WHAT,
        help="Which dependency: the environment that did not leak (freeze output, "
        "requirements of == pins, uv.lock or pylock.toml), instead of --package/--range; "
        "the smallest set of its changes towards --to that leaks is found, then each "
        "culprit's first bad release.",
        metavar="GOOD_ENV",
        file="from_env_name",
        column="text",
    )
    to_env_name: str | None = option(
        None, flag=None, help="The bad environment's file name (says its format).", max_length=200
    )
    to_env: str | None = option(
        None,
        flag="--to",
        panel=WHAT,
        help="The environment that leaks (same formats as --from).",
        metavar="BAD_ENV",
        file="to_env_name",
        column="text",
        validate_default=True,
    )
    package: str = option(
        "",
        flag="--package/-p",
        panel=WHAT,
        help="Package to bisect (required, unless --from/--to find it).",
        metavar="NAME",
        max_length=200,
        index=True,
        validate_default=True,
    )
    script: str = option(flag=None, help="The repro script's text (at most 1 MiB).", column="text")
    script_name: str = option(
        "repro.py", flag=None, help="The script's file name (a plain name ending in .py)."
    )
    python: str | None = option(
        None,
        flag="--python",
        panel=ENVIRONMENT,
        help="Python version for the environments, e.g. 3.12.",
        metavar="VER",
    )  # fmt: skip
    requirements: list[str] = option(
        default_factory=list,
        flag="--with",
        panel=ENVIRONMENT,
        help="Another requirement of the repro, e.g. 'numpy<2'; repeatable (-r FILE: a file).",
        metavar="REQ",
        column="json",
    )
    index_url: str | None = option(
        None,
        flag="--index-url",
        panel=ENVIRONMENT,
        help="Simple index to list and install from (default PyPI).",
        metavar="URL",
        max_length=MAX_TEXT,
    )
    extra_index_urls: list[str] = option(
        default_factory=list,
        flag="--extra-index-url",
        panel=ENVIRONMENT,
        help="Another index; repeatable.",
        metavar="URL",
        column="json",
    )
    find_links: list[str] = option(
        default_factory=list,
        flag="--find-links",
        panel=ENVIRONMENT,
        help="Directory of wheels/sdists; repeatable.",
        metavar="DIR",
        column="json",
    )
    pre: bool = option(False, flag="--pre", panel=WHAT, help="Include pre-releases in the range.")
    skip_yanked: bool = option(
        False,
        flag="--skip-yanked",
        panel=WHAT,
        help="Drop yanked releases.",
        verdict=False,  # which releases are candidates, not how one is judged
    )
    as_released: bool = option(
        False,
        flag="--as-released",
        panel=ENVIRONMENT,
        help="Resolve each candidate as on its upload day (uv --exclude-newer) instead of "
        "holding other packages at the good bound's versions.",
    )
    resolve_at: str | None = option(
        None,
        flag="--resolve-at",
        panel=ENVIRONMENT,
        help="Resolve the other packages as of DATE (YYYY-MM-DD or an ISO time) or 'latest' "
        "(today's index); default: as of the bad bound's upload time, so none is newer than "
        "the range.",
        metavar="DATE|latest",
        max_length=40,
    )
    base_env_name: str | None = option(
        None,
        flag=None,
        help="The base environment's file name (says its format; shown in the report).",
        max_length=200,
    )
    base_env: str | None = option(
        None,
        flag="--base-env",
        panel=ENVIRONMENT,
        help="Your own environment (a `uv pip freeze`/`pip freeze` output, a requirements "
        "file of == pins, a uv.lock or a pylock.toml): every candidate gets exactly those "
        "versions, with only the bisected package swapped (and what it forces noted).",
        metavar="FILE",
        file="base_env_name",
        column="text",
    )
    find_fix: bool = option(
        False,
        flag="--find-fix",
        panel=WHAT,
        help="Find the first release that no longer leaks.",
        verdict=False,  # the search's direction; each release is judged the same
    )
    all_transitions: bool = option(
        False,
        flag="--all-transitions",
        panel=WHAT,
        help="Map every leak/no-leak transition in the range, not just the first, also when "
        "the bounds agree (both clean, or both leaking: a band that starts and stops inside "
        "the range): every testable release runs once, largest untested gap first, then both "
        "sides of each transition once more (n + 2 per transition evaluations; a side whose "
        "re-run decides nothing runs once more, no release more than 3 times). A range with "
        "no transition ends bounds_failed (exit 3), saying so. Without it one extra run above "
        "the first bad release checks the range for a second transition, and the report says "
        "when the releases disagree with a single boundary.",
        verdict=False,  # which releases run, not how one is judged
    )
    # How strong a verdict is, not what it says: reuse rule 3 compares it.
    repeats: int = option(
        1,
        flag="--repeats",
        panel=RUNS,
        help="Runs per candidate.",
        metavar="N",
        ge=1,
        le=MAX_REPEATS,
        verdict=False,
    )
    max_runs: int = option(
        3,
        flag="--max-runs",
        panel=RUNS,
        help="Runs per candidate while inconclusive.",
        verdict=False,  # only decisive, agreeing verdicts are reused (reuse rule 3)
        metavar="N",
        ge=1,
        le=MAX_RUNS,
    )
    timeout_s: float = option(
        600.0,
        flag="--timeout",
        panel=RUNS,
        help="Seconds one run may take before it is killed.",
        metavar="S",
        gt=0,
        le=MAX_TIMEOUT_S,
    )
    memory_limit: int | None = option(
        None,
        flag="--memory-limit",
        panel=RUNS,
        help=f"Hard cap per run: {SIZE_HELP}, at least 16MiB (default 80% of the runner's RAM).",
        metavar="SIZE",
        column="bigint",
    )
    sample_hz: float = option(
        10.0,
        flag="--sample-hz",
        panel=RUNS,
        help="Memory samples per second once a run is 30 s old (faster before, and one "
        "at every step marker).",
        metavar="HZ",
        gt=0,
        le=100,
    )
    requires_gpu: bool = option(
        False,
        flag="--requires-gpu",
        panel=RUNS,
        help="Run only on runners with a GPU.",
        commands=("submit",),
    )
    min_growth_mib: float | None = option(
        None,
        flag="--min-growth",
        panel=RUNS,
        help="MiB the memory floor must grow over a run to count as a leak (default 8).",
        metavar="MIB",
        gt=0,
        le=1 << 30,
    )
    min_growth_fraction: float | None = option(
        None,
        flag="--min-growth-fraction",
        panel=RUNS,
        help="Growth as a fraction of the baseline floor that must also be exceeded "
        "(default 0.05).",
        metavar="F",
        ge=0,
        le=100,
    )
    reuse_verdicts: bool = option(
        True,
        flag="--reuse/--no-reuse",
        panel=RUNS,
        help="Reuse verdicts of your own earlier jobs judged under the same conditions "
        "(script, package, version, environment, --env variables, classifier, hardware "
        "class) when they are as strong as a fresh run; the boundary pair always runs again.",
        verdict=False,
    )
    early_stop: bool = option(
        True,
        flag="--early-stop/--no-early-stop",
        panel=RUNS,
        help="End a run as soon as it is sure to leak: only for repros that print step "
        f"markers, after the first marker, once a full run of the job took {MIN_HORIZON_S:.0f} "
        "s or more (or when it nears the memory cap); clean runs always run to the end.",
        verdict=False,  # reuse rule 3 checks each deciding run's stop instead
    )
    attribute: bool = option(
        True,
        flag="--attribute/--no-attribute",
        panel=STAGES,
        help="When the boundary is found, run its two releases once more under an allocation "
        "tracer (memray, native and Python stacks; tracemalloc when memray cannot install or "
        "names nothing), each run stopped once it has enough steps or its budget, and report "
        "the call stacks that grow in the first bad one only. Never decides a verdict.",
        verdict=False,
    )
    commits: bool = option(
        False,
        flag="--commits",
        panel=STAGES,
        help="Then bisect the commits between the boundary's two release tags, each built "
        "from source with uv (the repository comes from the release's project URLs, or "
        "--repo).",
        verdict=False,  # a stage after the releases' verdicts
    )
    repo: str | None = option(
        None,
        flag="--repo",
        panel=STAGES,
        help="The package's git repository for --commits: an http(s) URL, or (bisect-cli run "
        "only) a local clone's path.",
        metavar="URL|PATH",
        max_length=MAX_TEXT,
        verdict=False,  # only for --commits
    )
    variables: dict[str, str] = option(
        default_factory=dict,
        flag="--env",
        panel=ENVIRONMENT,
        help="An environment variable for the script, KEY=VALUE; repeatable "
        "(never BISECT_*; the runner adds only PATH, HOME, locale and CA settings).",
        metavar="KEY=VALUE",
        column="json",
    )

    webhook_url: str | None = option(
        None,
        flag="--webhook",
        panel=OUTPUT,
        help="An http(s) URL told when the job ends: one JSON POST signed with the "
        "service's shared secret (BISECT_WEBHOOK_SECRET), retried with backoff. The API "
        "takes only hosts its operator allows (BISECT_WEBHOOK_HOSTS, else public ones); "
        "`run` posts it itself once the job ends.",
        metavar="URL",
        max_length=MAX_TEXT,
        verdict=False,  # who is told, not what is found
    )

    @field_validator(*envpolicy.RULES, check_fields=False)  # "range" is JobCreate's
    @classmethod
    def _env_policy(cls, value: Any, info: ValidationInfo) -> Any:
        # Every rule between the environment-policy fields, in one place (service/envpolicy.py).
        assert info.field_name is not None
        return envpolicy.check(info.field_name, value, info.data)

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not info.data.get("commits"):
            raise ValueError("only with --commits, which bisects the repository's commits")
        if not value.strip() or any(ch in value for ch in "\0\n\r"):
            raise ValueError("empty or not one line; give an http(s) URL or a local path")
        return value.strip()

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        # Rule 1 of the outbound rule (a URL, http or https); where it may lead is the
        # submission policy's (service/policy.py), and checked again before each delivery.
        if value is not None:
            try:
                outbound.parse(value)
            except outbound.Refused as exc:
                raise ValueError(outbound.describe("webhook", value, exc)) from None
        return value

    @field_validator("package")
    @classmethod
    def _package(cls, value: str) -> str:
        if not value:  # only with --from/--to (`_env_policy` requires it otherwise)
            return value
        try:
            name = Requirement(value).name
        except InvalidRequirement:
            name = None
        if name is None or canonicalize_name(value) != canonicalize_name(name):
            raise ValueError(f"{value!r} is not a package name")
        return value

    @field_validator("script")
    @classmethod
    def _script(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the script is empty")
        if len(value.encode()) > MAX_SCRIPT_BYTES:
            raise ValueError("the script is larger than 1 MiB")
        return value

    @field_validator("script_name")
    @classmethod
    def _script_name(cls, value: str) -> str:
        if not SCRIPT_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a plain file name ending in .py (letters, digits, _ . -)"
            )
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if PYTHON_VERSION.fullmatch(value.strip()) is None:
            raise ValueError(f"{value!r} is not a Python version; write 3.MINOR or 3.MINOR.PATCH")
        return value.strip()

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, values: list[str]) -> list[str]:
        _bounded(values, MAX_REQUIREMENTS, "requirements")
        for value in values:
            try:
                Requirement(value)
            except InvalidRequirement as exc:
                reason = str(exc).splitlines()[0]
                raise ValueError(f"requirement {value!r} does not parse: {reason}") from exc
        return values

    @field_validator("extra_index_urls", "find_links")
    @classmethod
    def _urls(cls, values: list[str]) -> list[str]:
        return _bounded(values, MAX_URLS, "entries")

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _memory_limit(cls, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int | str) or isinstance(value, bool):
            raise ValueError(f"{value!r} is not {SIZE_HELP}")
        size = parse_size(value)
        if not MIN_MEMORY_LIMIT <= size <= MAX_MEMORY_LIMIT:
            raise ValueError(f"{value!r} is outside 16MiB..1PiB, the caps a run can have")
        return size

    @field_validator("variables")
    @classmethod
    def _variables(cls, values: dict[str, str]) -> dict[str, str]:
        if len(values) > MAX_VARIABLES:
            raise ValueError(f"at most {MAX_VARIABLES} variables, got {len(values)}")
        for name, value in values.items():
            if not VARIABLE_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a variable name (letters, digits, _)")
            if name.upper().startswith("BISECT_"):
                raise ValueError(f"{name}: BISECT_* variables are the service's own")
            if len(value.encode()) > MAX_VARIABLE_BYTES or "\0" in value:
                raise ValueError(f"{name}: a value is at most 4096 bytes, without NUL")
        return values

    @property
    def env_policy(self) -> envpolicy.EnvPolicy:
        """How the packages besides the bisected one are chosen: one of four kinds."""
        return envpolicy.of(self)

    @property
    def classifier(self) -> dict[str, float]:
        """The classifier settings this job overrides."""
        names = ("min_growth_mib", "min_growth_fraction")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


def _bounded(values: list[str], most: int, what: str) -> list[str]:
    if len(values) > most:
        raise ValueError(f"at most {most} {what}, got {len(values)}")
    for value in values:
        if len(value) > MAX_TEXT:
            raise ValueError(f"an entry is longer than {MAX_TEXT} characters")
    return values


def option_fields(command: str | None = None) -> dict[str, FieldInfo]:
    """The options that have a flag, in definition order (only `command`'s when given)."""
    return {
        name: info
        for name, info in JobOptions.model_fields.items()
        if (cli := cli_of(info)) and (command is None or command in cli["commands"])
    }


def file_options() -> dict[str, tuple[str, str]]:
    """The options whose flag names a file the CLI reads: field -> (flag, file name field)."""
    return {
        name: (cli["flag"].split("/")[0], cli["file"])
        for name, info in option_fields().items()
        if (cli := cli_of(info)) and cli.get("file")
    }


def flag_names() -> dict[str, str]:
    """Field name -> the flag a user types, so messages name what they can fix."""
    names = {"script": "SCRIPT", "requirements": "--with/-r", "range": "--range"}
    names |= {name_field: flag for flag, name_field in file_options().values()}
    for name, info in option_fields().items():
        cli = cli_of(info)
        assert cli is not None
        names.setdefault(name, cli["flag"].split("/")[0])
    return names


def default_text(info: FieldInfo) -> str:
    """How the README states a default ("" when there is none worth saying)."""
    if info.is_required():
        return "required"
    if info.default_factory is not None or info.default is None:
        return ""
    if isinstance(info.default, bool):
        return "on" if info.default else ""
    return f"{info.default:g}" if isinstance(info.default, float) else str(info.default)


def markdown_table() -> str:
    """The README's table of job options, generated from `JobOptions`."""
    rows = ["| option | meaning | default |", "| --- | --- | --- |"]
    for info in option_fields().values():
        cli = cli_of(info)
        assert cli is not None
        flags = ", ".join(f"`{f}`" for f in _display_flags(cli))
        only = "" if len(cli["commands"]) > 1 else f" (`{cli['commands'][0]}` only)"
        cells = (flags, f"{info.description}{only}", default_text(info))
        # A "|" inside a cell (DATE|latest) would split it, code span or not.
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _display_flags(cli: dict[str, Any]) -> list[str]:
    flag, metavar = cli["flag"], cli["metavar"]
    if flag.count("--") == 2:  # --on/--off
        return [flag]
    parts = flag.split("/")
    return [f"{p} {metavar}" if metavar else p for p in parts]


if __name__ == "__main__":  # `python -m service.options`: the README's table
    print(markdown_table())
