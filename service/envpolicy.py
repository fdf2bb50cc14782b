"""A job's environment policy: how the packages besides the bisected one are chosen.

One idea, submitted as five flat fields of `JobOptions` (service/options.py), which the
wire, the CLI flags and the `job` table's columns keep as they are: `as_released`,
`resolve_at`, `base_env` (with `base_env_name`) and `from_env`/`to_env` (with their
names). `of(options)` reads them as one of four variants, discriminated by `kind`
(`EnvPolicy`), and the code that acts on the policy asks the variant, never the fields:

- `ResolvedAt` (the default, `--resolve-at DATE|latest`): the job's pins are resolved
  once, on a runner, for the good bound, as of an instant (engine/resolution.py), and
  every candidate is built with them as constraints.
- `AsReleased` (`--as-released`): no shared pins; each candidate is resolved as on its own
  upload day.
- `BaseEnv` (`--base-env FILE`): the user's file is the pins (engine/baseenv.py); only the
  bisected package is swapped.
- `EnvPair` (`--from GOOD_ENV --to BAD_ENV`): two whole environments; the search finds the
  changes that leak (service/stages.py), so the package and the range are not options.

Rules (`check`: the one validator `JobOptions` runs on each field below, in field order;
`given` is what the fields before it left valid, so a refused field chooses nothing):

1. A field chooses a kind when it is given (`CHOOSES`: not None, not False): `from_env`
   an `EnvPair`, `base_env` a `BaseEnv`, `as_released` `AsReleased`, `resolve_at`
   `ResolvedAt`. Nothing chosen is `ResolvedAt` with no instant (the bad bound's upload).
2. A field given after another chose a kind it cannot be combined with is refused, at the
   later field, with why (`RULES`: each field's steps, in order). `find_fix` is refused
   with `EnvPair`, which finds what makes the good environment leak.
3. `to_env` is given exactly when `from_env` is.
4. `package` and `range` are what a release search needs: empty with `EnvPair`, required
   otherwise.
5. Each value parses as its variant reads it (`PARSE`): an environment file through
   engine/baseenv.py (its errors name the field), `resolve_at` through engine/resolution.py
   (and is stored stripped).

A new policy is a variant here (its fields, rules and the methods below) and its options in
service/options.py; the modules that act on the policy call the variant's methods.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field

from engine import baseenv, resolution

# (version, upload time) of one end of a job's range.
Bound = tuple[str, datetime | None]


class Options(Protocol):
    """The submitted fields a policy is read from (`JobOptions`, and so `Job`)."""

    as_released: bool
    resolve_at: str | None
    base_env: str | None
    base_env_name: str | None
    from_env: str | None
    from_env_name: str | None
    to_env: str | None
    to_env_name: str | None


class _Policy(BaseModel):
    """What every kind answers; the defaults are a policy that holds shared pins."""

    model_config = ConfigDict(frozen=True)

    # Candidates are built with the job's pins (`Job.constraints`) as constraints.
    shared_pins: ClassVar[bool] = True
    # Every pin is installed, not only what a candidate needs (`EnvSpec.base_env`).
    holds_every_pin: ClassVar[bool] = False

    @classmethod
    def read(cls, options: Options) -> Self:
        """This kind from the submitted fields."""
        return cls()

    def pins_as_of(self, good: Bound, newest: Bound) -> datetime | None:
        """The instant the job's pins are resolved as of (None: none, or today's index)."""
        return None

    def base_pins(self, package: str) -> list[str]:
        """The pins the job brings itself (sorted, `package`'s own dropped)."""
        return []

    def exclude_newer(self, uploaded: datetime | None, as_of: datetime | None) -> datetime | None:
        """A candidate's upload cutoff, given its upload time and the pins' instant."""
        return as_of

    def describe(self, *, package: str, as_of: datetime | None, newest: str, find_fix: bool) -> str:
        """The report's "environment" line: how the other packages were chosen, and why."""
        raise NotImplementedError


class ResolvedAt(_Policy):
    """Pins resolved once for the good bound, as of `at` (None: the newest bound's upload)."""

    kind: Literal["resolved_at"] = "resolved_at"
    at: str | None = None

    @classmethod
    def read(cls, options: Options) -> Self:
        return cls(at=options.resolve_at)

    def pins_as_of(self, good: Bound, newest: Bound) -> datetime | None:
        return resolution.pins_as_of(
            as_released=False, resolve_at=self.at, good=good, newest=newest
        )

    def describe(self, *, package: str, as_of: datetime | None, newest: str, find_fix: bool) -> str:
        return resolution.describe(
            as_released=False, resolve_at=self.at, as_of=as_of, newest=newest, find_fix=find_fix
        )


class AsReleased(_Policy):
    """Each candidate resolved as on its own upload day."""

    kind: Literal["as_released"] = "as_released"
    shared_pins: ClassVar[bool] = False

    def exclude_newer(self, uploaded: datetime | None, as_of: datetime | None) -> datetime | None:
        return uploaded  # only what the index held the moment the candidate was uploaded

    def describe(self, *, package: str, as_of: datetime | None, newest: str, find_fix: bool) -> str:
        return resolution.describe(
            as_released=True, resolve_at=None, as_of=as_of, newest=newest, find_fix=find_fix
        )


class BaseEnv(_Policy):
    """The user's own environment file is the pins; only the bisected package is swapped."""

    kind: Literal["base_env"] = "base_env"
    holds_every_pin: ClassVar[bool] = True
    text: str
    name: str | None = None

    @classmethod
    def read(cls, options: Options) -> Self:
        assert options.base_env is not None
        return cls(text=options.base_env, name=options.base_env_name)

    def parsed(self) -> baseenv.BaseEnv:
        return baseenv.parse(self.text, self.name)

    def base_pins(self, package: str) -> list[str]:
        return self.parsed().split(package)[0]

    def describe(self, *, package: str, as_of: datetime | None, newest: str, find_fix: bool) -> str:
        return baseenv.describe(self.parsed(), package=package, source=self.name)


class EnvPair(_Policy):
    """Two whole environments, the good and the bad; the search finds the changes that leak."""

    kind: Literal["env_pair"] = "env_pair"
    good: str
    good_name: str | None = None
    bad: str
    bad_name: str | None = None

    @classmethod
    def read(cls, options: Options) -> Self:
        assert options.from_env is not None and options.to_env is not None
        return cls(
            good=options.from_env,
            good_name=options.from_env_name,
            bad=options.to_env,
            bad_name=options.to_env_name,
        )

    @property
    def labels(self) -> tuple[str, str]:
        """How the two environments are named: their file names, else their flags."""
        return self.good_name or "--from", self.bad_name or "--to"

    def pins(self) -> tuple[dict[str, str], dict[str, str]]:
        """The good and the bad environment's pins (errors name --from or --to)."""
        good = baseenv.parse(self.good, self.good_name, field="from_env").pins
        return good, baseenv.parse(self.bad, self.bad_name, field="to_env").pins

    def describe(self, *, package: str, as_of: datetime | None, newest: str, find_fix: bool) -> str:
        return (
            f"every candidate is {self.labels[0]} with the culprits' new "
            "versions, each pin held exactly (a mix uv cannot resolve is skipped)"
        )


EnvPolicy = Annotated[ResolvedAt | AsReleased | BaseEnv | EnvPair, Field(discriminator="kind")]

# Which field chooses which kind when given (rule 1), in the order `of` prefers them.
CHOOSES: dict[str, type[_Policy]] = {
    "from_env": EnvPair,
    "base_env": BaseEnv,
    "as_released": AsReleased,
    "resolve_at": ResolvedAt,
}


def _given(value: Any) -> bool:
    return value is not None and value is not False


def chosen(given: Mapping[str, Any]) -> Iterator[type[_Policy]]:
    """The kinds the given fields choose, in `CHOOSES` order."""
    return (kind for field, kind in CHOOSES.items() if _given(given.get(field)))


def of(options: Options) -> EnvPolicy:
    """The policy a job's (validated) fields state."""
    fields = {name: getattr(options, name) for name in CHOOSES}
    kind = next(chosen(fields), ResolvedAt)
    return kind.read(options)  # type: ignore[return-value]


# --- validation: the rules of the module docstring, each a step of a field ---

HOLD_EVERY = "cannot be combined with --from/--to: the two environments hold every version already"
BASE_SAYS = (
    "cannot be combined with {}: the base environment already says every other package's "
    "version; give one"
)


@dataclass(frozen=True)
class Conflict:
    """Rule 2: the field is refused, given, once an earlier field chose `kind`."""

    kind: type[_Policy]
    message: str


@dataclass(frozen=True)
class Search:
    """Rule 4: empty with `EnvPair` (else `refused`), given otherwise (else `missing`)."""

    refused: str
    missing: str


class Pair:
    """Rule 3: `to_env` is given exactly when `from_env` is."""


class Parse:
    """Rule 5: the value as its variant reads it."""


Step = Conflict | Search | Pair | Parse
PAIR, PARSE = Pair(), Parse()

# Each field's steps, in the order they run (the first that fails is its error).
RULES: dict[str, tuple[Step, ...]] = {
    "from_env": (PARSE,),
    "to_env": (PAIR, PARSE),
    "package": (
        Search(
            "not with --from/--to: the two environments say which packages changed, and the "
            "search finds the culprit",
            "missing; name the package whose releases to bisect",
        ),
    ),
    "as_released": (Conflict(EnvPair, HOLD_EVERY),),
    "resolve_at": (
        Conflict(
            AsReleased,
            "cannot be combined with as released (--as-released): each says when to resolve; "
            "give one",
        ),
        PARSE,
        Conflict(EnvPair, HOLD_EVERY),
    ),
    "base_env": (
        Conflict(EnvPair, "cannot be combined with --from/--to: --from is the base environment"),
        Conflict(AsReleased, BASE_SAYS.format("--as-released")),
        Conflict(ResolvedAt, BASE_SAYS.format("--resolve-at")),
        PARSE,
    ),
    "find_fix": (
        Conflict(
            EnvPair,
            "cannot be combined with --from/--to, which find what makes the good environment leak",
        ),
    ),
    "range": (
        Search(
            "not with --from/--to: the two environments are the range",
            "missing; write GOOD..BAD, e.g. 1.0.0..1.0.9",
        ),
    ),
}


def _parse_env(field: str) -> Callable[[str, Mapping[str, Any]], str]:
    def parse(value: str, given: Mapping[str, Any]) -> str:
        baseenv.parse(value, given.get(f"{field}_name"), field=field)  # InvalidInput says why
        return value

    return parse


def _parse_resolve_at(value: str, given: Mapping[str, Any]) -> str:
    resolution.parse_resolve_at(value)  # InvalidInput, a ValueError, says what is allowed
    return value.strip()


PARSERS: dict[str, Callable[[str, Mapping[str, Any]], str]] = {
    "from_env": _parse_env("from_env"),
    "to_env": _parse_env("to_env"),
    "base_env": _parse_env("base_env"),
    "resolve_at": _parse_resolve_at,
}


def check(field: str, value: Any, given: Mapping[str, Any]) -> Any:
    """`value` of `field` checked against the policy the `given` fields chose (the rules
    above); returns it (stripped, for `resolve_at`) or raises ValueError, for that field."""
    kinds = set(chosen(given))
    for step in RULES[field]:
        match step:
            case Conflict(kind=kind, message=message) if _given(value) and kind in kinds:
                raise ValueError(message)
            case Search(refused=refused, missing=missing):
                if EnvPair in kinds:
                    if value:
                        raise ValueError(refused)
                    return value
                if not value:
                    raise ValueError(missing)
            case Pair() if (value is None) != (given.get("from_env") is None):
                raise ValueError(
                    "give both --from (the good environment) and --to (the bad one), or neither"
                )
            case Parse() if value is not None:
                value = PARSERS[field](value, given)
    return value
