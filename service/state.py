"""What a job's JSON columns hold, as pydantic models, and the column type that stores them.

`Job.stages`, `result`, `dependency`, `attribution`, `commit` and `search` (service/models.py)
are stored as JSON and read and written as these models; the writers are service/pipeline.py
(the stages' records), service/stages.py (where a job starts) and service/scheduler.py (how
it ends). To learn what keys a job has, read this module.

Rules:
1. The stored JSON is what the writers wrote before the models existed: a model is dumped
   with the fields that were set (`exclude_unset`), so a record written without a key reads
   back without it and rows already in databases load unchanged. Keys no model names are
   kept (extra="allow"): nothing stored is lost by reading and writing a row.
2. Records are frozen. A change is a new record (`model_copy(update=...)`) assigned to the
   column: SQLAlchemy sees assignments, never changes inside a JSON value.
3. The user's options (`Job.package`, `good`, `bad`) are never written after the job is
   made. Where a stage moves the search (the mix stage's first culprit), `Job.search`
   holds the package and range searched now, and `Job.target` reads it (or the options).
4. A record still reads as the dict it is stored as (`record["key"]`, `.get`, == a dict),
   for code written against the JSON; new code reads attributes.
"""

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from sqlalchemy import JSON
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from engine.ddmin import Change


class StageKind(StrEnum):
    """A job's fixed stages (service/stages.py has the order); a further culprit's releases
    are the stage `CULPRIT_PREFIX + name`."""

    MIX = "mix"  # --from/--to: ddmin over the changed packages
    RELEASES = ""  # the releases of the package searched (`Job.target`)
    ATTRIBUTE = "attribute"  # --attribute: the boundary pair traced
    COMMIT = "commit"  # --commits: the boundary's commits


CULPRIT_PREFIX = "release:"


class StageStatus(StrEnum):
    """How a stage ended: the planner's statuses (engine/planner.py `Status`), and "done"
    for a stage that finds no boundary (attribute)."""

    FOUND = "found"
    BOUNDS_FAILED = "bounds_failed"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"
    DONE = "done"


class Record(BaseModel):
    """A stored JSON object (rules 1, 2 and 4)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    def dump(self) -> dict[str, Any]:
        """The JSON as stored: the fields that were set (rule 1)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def __getitem__(self, key: str) -> Any:
        if key not in self.model_fields_set and key not in (self.model_extra or {}):
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, KeyError) is not KeyError

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.dump() == other
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # equal to dicts, which do not hash


class Transition(Record):
    """One leak/no-leak transition of a range (service/schemas.py `TransitionRow`)."""

    before: str
    after: str
    change: str  # "starts leaking" | "stops leaking"
    confirmed: bool
    between: list[str] = Field(default_factory=list)


class SearchOutcome(Record):
    """The planner's outcome of a stage of versions (engine/planner.py `Outcome`), by
    version: `Job.result`, and a releases or commit stage's `StageRecord.result`. A job that
    ended before any such stage (a mix that could not go on) holds only status and message."""

    status: StageStatus
    last_old: str | None = None  # regression: last good; find-fix: last leaking
    first_new: str | None = None
    skipped: list[str] = Field(default_factory=list)  # unjudgeable, between the two
    message: str | None = None
    transitions: list[Transition] = Field(default_factory=list)
    disagree: list[str] = Field(default_factory=list)
    not_monotone: str | None = None


class StageRecord(Record):
    """A finished stage, one entry of `Job.stages` in the order they ended."""

    stage: str  # a `StageKind`, or CULPRIT_PREFIX + a culprit's name
    status: StageStatus
    message: str | None = None
    package: str | None = None  # the package whose versions it moved (stages of versions)
    result: SearchOutcome | None = None


class Mix(Record):
    """A judged mix of the --from/--to search, as `Dependency.mixes` lists it."""

    applied: list[str] = Field(default_factory=list)  # the changes applied to --from
    label: str | None = None
    verdict: str | None = None
    candidate_id: int | None = None


class Dependency(Record):
    """`Job.dependency` (--from/--to): both environments, what changed between them, and
    once the mix stage ends, the minimal leaking set and the mixes it took."""

    good: dict[str, str] = Field(default_factory=dict)  # --from's pins, {name: version}
    bad: dict[str, str] = Field(default_factory=dict)
    changes: list[Change] = Field(default_factory=list)  # in name order
    worst_case_mixes: int | None = None
    mixes: list[Mix] = Field(default_factory=list)
    message: str | None = None
    # Set when ddmin found the set (engine/ddmin.py `Minimal`).
    culprits: list[Change] | None = None
    certified: bool | None = None
    untested: list[list[str]] | None = None


class Attribution(Record):
    """`Job.attribution` (--attribute): the boundary pair's traces compared, per tracer
    (each tracer's finding is engine/attribution.py's dict: `compare` plus `stops`)."""

    package: str | None = None
    last_good: str | None = None
    first_bad: str | None = None
    tracers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    message: str | None = None
    reused_from: int | None = None  # the earlier job it was copied from (service/reuse.py)


class CommitRef(Record):
    sha: str
    subject: str | None = None


class CommitFinding(SearchOutcome):
    """`Job.commit` (--commits): what a runner is asked to list, then (as `SearchOutcome`)
    how the planner ended over the commits, by sha. A listing that failed: status "error"
    and the message; "commits" is set only once they were bisected."""

    status: StageStatus | None = None  # type: ignore[assignment]  # None while listing
    repo: str | None = None
    last_good_release: str | None = None
    first_bad_release: str | None = None
    first_bad: CommitRef | None = None
    last_good: CommitRef | None = None
    skipped_commits: list[CommitRef] = Field(default_factory=list)
    unbuildable: list[CommitRef] = Field(default_factory=list)
    commits: int | None = None  # how many were bisected


class Search(Record):
    """`Job.search`: the package and range searched now, where a stage moved it away from
    the user's options (rule 3): the mix stage's first culprit and its two versions."""

    package: str
    good: str
    bad: str

    @property
    def range(self) -> str:
        return f"{self.good}..{self.bad}"


class JSONModel(TypeDecorator[Any]):
    """A JSON column read and written as `model` (a list of them with `many`): the SQL type
    stays JSON, so rows and migrations are those of a plain JSON column."""

    impl = JSON
    cache_ok = True

    def __init__(self, model: type[BaseModel], many: bool = False) -> None:
        super().__init__()
        self.model, self.many = model, many  # named as the arguments: the cache key
        self._adapter: TypeAdapter[Any] = TypeAdapter(list[model] if many else model)  # type: ignore[valid-type]

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        # A dict (a fixture, an older caller) is checked as the model before it is stored.
        valid = self._adapter.validate_python(value)
        return self._adapter.dump_python(valid, mode="json", exclude_unset=True)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else self._adapter.validate_python(value)


def dump(record: Record | None) -> dict[str, Any] | None:
    """A record as the dict it is stored as; None stays None (for wire models of dicts)."""
    return None if record is None else record.dump()
