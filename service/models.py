"""SQLModel tables: jobs, their candidates, trials and memory samples.

A job's options are defined once in `service.options.JobOptions` (pure pydantic: the
client's too), which `Job` extends; where an option's column is not what its type says,
its `Stored` note names it and `_OptionColumns` gives sqlmodel that column. Wire models
(what the API and CLI print) live in `service.schemas`.
A job's JSON columns of state (its stages, outcome, findings, search) are typed: the models
and the column type that stores them are `service.state`'s. The other JSON columns hold
lists and analysis dicts whose shape belongs to the code that writes them (the classifier,
the environment builder).
"""

import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel
from sqlalchemy import JSON, BigInteger, Column, Dialect, Float, Index, Text, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel
from sqlmodel.main import FieldInfoMetadata

from contract.wire import TrialKind
from service.options import JobOptions, stored_of
from service.state import (
    Attribution,
    CommitFinding,
    Dependency,
    JSONModel,
    Search,
    SearchOutcome,
    StageRecord,
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FOUND = "found"
    BOUNDS_FAILED = "bounds_failed"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


class PinState(StrEnum):
    """Where a job's pins (`Job.constraints`) stand; service/pins.py holds the rules."""

    NONE = "none"  # nothing to hold (as released, or pins given)
    PENDING = "pending"  # a resolve trial will set them before any candidate runs
    RESOLVED = "resolved"
    FAILED = "failed"  # they could not be resolved: candidates resolve freely


class TrialStatus(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    CANCELLED = "cancelled"


class FiniteFloat(TypeDecorator[float]):
    """A float column that holds no NaN or Infinity: such a value is written and read as
    NULL (unknown). The wire refuses them now (contract/wire.py rule 1); a row stored
    before that (an Infinity duration) once made every later lease of its job fail."""

    impl = Float
    cache_ok = True

    def process_bind_param(self, value: float | None, dialect: Dialect) -> float | None:
        return value if value is None or math.isfinite(value) else None

    def process_result_value(self, value: float | None, dialect: Dialect) -> float | None:
        return value if value is None or math.isfinite(value) else None


def _finite() -> Any:
    return Field(default=None, sa_column=Column(FiniteFloat))


def _json(default: Any = None) -> Any:
    return Field(default_factory=lambda: [] if default is None else default, sa_column=Column(JSON))


def _state(model: type[BaseModel]) -> Any:
    """A nullable JSON column read and written as `model` (service/state.py)."""
    return Field(default=None, sa_column=Column(JSONModel(model)))


# The column types an option's `Stored` note names (service/options.py).
STORED_TYPES: dict[str, Any] = {"text": Text, "json": JSON, "bigint": BigInteger}


class _OptionColumns(JobOptions):
    """`JobOptions` whose fields carry sqlmodel's column metadata (what `sqlmodel.Field(
    sa_type=..., index=...)` attaches), made from each field's `Stored` note. Its fields are
    this subclass's own copies: the client's `JobOptions` is left as it is."""


def _columns(model: type[BaseModel]) -> None:
    """Append to each of `model`'s fields with a `Stored` note the column sqlmodel reads."""
    for info in model.model_fields.values():
        if (stored := stored_of(info)) is not None:
            column = {"sa_type": STORED_TYPES[stored.type]} if stored.type else {}
            info.metadata.append(FieldInfoMetadata(index=stored.index, **column))


_columns(_OptionColumns)


class Job(_OptionColumns, SQLModel, table=True):
    """A bisection: its options (`JobOptions`) plus what the service adds and learns."""

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    status: str = Field(default=JobStatus.QUEUED, index=True)
    message: str | None = Field(default=None, sa_column=Column(Text))

    # `package` (JobOptions), `good` and `bad` are the user's, as submitted: never written
    # after the job is made. What is searched now is `target` (service/state.py rule 3).
    good: str
    bad: str
    script_sha256: str = Field(index=True)
    # The good bound's resolved pins, holding the rest of the environment still.
    constraints: list[str] = _json()
    pin_state: str = PinState.NONE
    # What decides the pins (service/pins.py): jobs with the same key can share them.
    pin_key: str | None = Field(default=None, index=True)
    # The instant the pins are resolved as of (engine/resolution.py); None: today's index.
    pins_as_of: datetime | None = None

    # How the job's search ended: stage ""'s planner outcome, or the mix stage's status.
    result: SearchOutcome | None = _state(SearchOutcome)
    machine: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # "cpu" or "gpu": part of the verdict-reuse key, since a GPU leak needs a GPU to show.
    hardware_class: str = "cpu"
    # Made by `bisect-cli run`: that process runs it; no runner claims it and the service's
    # maintenance never advances it, even when both share one database (service/queue.py).
    local: bool = Field(default=False, index=True)
    # The name of the token that submitted it (service/http/deps.py); None in an open service.
    owner: str | None = Field(default=None, index=True)
    # sha256 of (owner, the submission's Idempotency-Key): a retried POST /jobs finds this job
    # instead of creating another (service/api/routes/jobs.py). Unique; None without a key.
    idempotency: str | None = Field(default=None, unique=True)

    # The site the job was submitted through (no trailing slash): its webhook's links when
    # BISECT_PUBLIC_URL is unset (service/webhooks.py); None for `bisect-cli run`'s jobs.
    site_url: str | None = Field(default=None, max_length=2000)

    # What the job's later stages found (service/stages.py has the order and the rules).
    # Each finished stage's record, in the order they ended.
    stages: list[StageRecord] = Field(
        default_factory=list, sa_column=Column(JSONModel(StageRecord, many=True))
    )
    # --from/--to: the changed packages, the minimal leaking set and the mixes it took.
    dependency: Dependency | None = _state(Dependency)
    # --attribute: the stacks that grow in the first bad release and not the last good.
    attribution: Attribution | None = _state(Attribution)
    # --commits: the first bad commit of the boundary's package (sha, subject, ...).
    commit: CommitFinding | None = _state(CommitFinding)
    # The package and range searched now, where a stage moved the search off the options
    # (the mix stage's first culprit); None: the options' own.
    search: Search | None = _state(Search)

    @property
    def target(self) -> Search:
        """The package and range being searched now: `search`, else the user's options."""
        return self.search or Search(package=self.package, good=self.good, bad=self.bad)


class Candidate(SQLModel, table=True):
    __table_args__ = (Index("ix_candidate_job_position", "job_id", "position", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    position: int
    version: str
    upload_time: datetime | None = None
    yanked: bool = False
    yanked_reason: str | None = None
    testable: bool = True
    untestable_reason: str | None = None
    # One aggregated verdict per completed evaluation, in order.
    evaluations: list[str] = _json()
    verdict: str | None = None
    growth_mib: float | None = None
    # The latest evaluation's runs judged together (engine/pooled.py `PooledAnalysis`
    # plus "evaluation"); None when it had fewer than two runs to pool.
    pooled: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    freeze: list[str] = _json()
    resolution: str | None = None
    resolution_note: str | None = Field(default=None, sa_column=Column(Text))
    env_seconds: float | None = _finite()
    # Candidate (in an earlier job) whose verdicts were reused instead of running again.
    reused_from: int | None = None
    # Same script, package, version, environment, classifier and hardware class -> same verdict.
    reuse_key: str | None = Field(default=None, index=True)
    # The other job (same reuse key, same owner) whose verdict of this release disagrees with
    # this one's (service/reuse.py rule 6): shown as flaky, and never a reuse source again.
    contradicted_by_job: int | None = None
    # The job stage it belongs to (service/stages.py): "" the releases of `Job.package`,
    # "mix" a --from/--to mix, "release:NAME" a further culprit's releases, "commit".
    stage: str = Field(default="", index=True)
    # The whole environment it is built with, every pin held exactly (mixes and culprit
    # releases); empty: the job's own environment rules.
    pins: list[str] = _json()
    # A mix: the names of the changes (engine/ddmin.py) applied to the good environment.
    applied: list[str] = _json()
    # A commit: what uv builds the package from (`git+URL@SHA`) and the commit's subject.
    source: str | None = Field(default=None, sa_column=Column(Text))
    subject: str | None = Field(default=None, sa_column=Column(Text))


class Trial(SQLModel, table=True):
    __table_args__ = (
        Index("ix_trial_status_id", "status", "id"),
        # Users count a job's trials 1, 2, ...; the global id is for the API's paths only.
        UniqueConstraint("job_id", "number", name="uq_trial_job_number"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    # The trial's number within its job (store.new_trial), the one shown to users.
    number: int = 0
    candidate_id: int = Field(foreign_key="candidate.id", index=True)
    evaluation: int = 1
    kind: str = TrialKind.RUN  # a `TrialKind`, stored as its string
    # Variables the service adds for this run (service/specs.py, longer runs); the job's win.
    hints: dict[str, str] = _json({})
    status: str = Field(default=TrialStatus.QUEUED)
    attempt: int = 0
    runner_id: str | None = None
    lease_expires_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    exit_code: int | None = None
    oom_killed: bool = False
    timed_out: bool = False
    cap_method: str | None = None
    duration_s: float | None = _finite()
    env_seconds: float | None = _finite()
    # The running trial as of its last heartbeat, for progress displays (contract/live.py:
    # its memory, the steps its markers span, its first and latest floor); None where the
    # runner did not say, and cleared with each new lease (service/queue.py).
    rss: int | None = Field(default=None, sa_column=Column(BigInteger))
    steps: int | None = Field(default=None, sa_column=Column(BigInteger))
    floor_first: int | None = Field(default=None, sa_column=Column(BigInteger))
    floor: int | None = Field(default=None, sa_column=Column(BigInteger))
    log_tail: str | None = Field(default=None, sa_column=Column(Text))
    gpu_source: str | None = None
    verdict: str | None = None
    analysis: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    error: str | None = Field(default=None, sa_column=Column(Text))
    # Attribute trials: the tracer ("tracemalloc" | "memray") and the profile it reported.
    trace: str | None = None
    profile: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # Commits trials: the commits the runner listed ({"sha", "subject"}, oldest first);
    # None while it has not answered, or when listing failed (`error` says why).
    commits: list[dict[str, str]] | None = Field(default=None, sa_column=Column(JSON))
    # Its infrastructure failures, oldest first (service/queue.py, infrastructure rules):
    # each the runner's `contract.wire.Failure` with "runner" and "attempt" added; and the
    # runner of the latest, which a claim passes over while another runner is live.
    infra_failures: list[dict[str, Any]] = _json()
    infra_runner: str | None = None


class MemorySample(SQLModel, table=True):
    __tablename__ = "memory_sample"

    id: int | None = Field(default=None, primary_key=True)
    trial_id: int = Field(foreign_key="trial.id", index=True)
    t: float
    rss: int = Field(sa_column=Column(BigInteger, nullable=False))
    anon: int | None = Field(default=None, sa_column=Column(BigInteger))
    shared: int | None = Field(default=None, sa_column=Column(BigInteger))
    gpu: int | None = Field(default=None, sa_column=Column(BigInteger))
    step: int | None = None


class Runner(SQLModel, table=True):
    """A registered runner agent; it talks HTTP only and never sees the database."""

    id: str = Field(primary_key=True)
    name: str
    registered_at: datetime = Field(default_factory=utcnow)
    last_seen: datetime = Field(default_factory=utcnow, index=True)
    capabilities: dict[str, Any] = _json({})
    labels: dict[str, str] = _json({})
    gpu_count: int = 0
    active: bool = True
    # sha256 (hex) of the secret registration returned; the secret itself is never stored.
    # Every later runner request presents the secret (X-Runner-Secret), which names the runner.
    secret_hash: str | None = Field(default=None, unique=True)


class WebhookStatus(StrEnum):
    PENDING = "pending"  # an attempt is due at `next_at`
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # every attempt failed: no more are made


class WebhookDelivery(SQLModel, table=True):
    """One webhook to send for a job that ended, and its attempts (service/webhooks.py)."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (Index("ix_webhook_delivery_status_next_at", "status", "next_at"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    # The job's --webhook URL; None: the operator's BISECT_WEBHOOK_URL, read when sent and
    # never stored (it may be a capability URL).
    url: str | None = Field(default=None, sa_column=Column(Text))
    status: str = WebhookStatus.PENDING
    created_at: datetime = Field(default_factory=utcnow)
    next_at: datetime | None = Field(default_factory=utcnow)
    # A claim: the process sending the next attempt and until when (service/webhooks.py).
    claim: str | None = None
    claimed_until: datetime | None = None
    # Every attempt, oldest first: {"at", "status" (HTTP), "error", "excerpt", "next_at"}.
    attempts: list[dict[str, Any]] = _json()
