"""The API's models: every shape a client of the service reads or sends, in one module.

What `POST /jobs` and `bisect-cli run` take (`JobCreate`, `AgainRequest`), what the API
answers (jobs, trials, samples, runners' acks), and the typed `Report` of a job that
`run --json`, `submit --wait`, `status`, the API, the page and the Markdown report all show.

Rules: models, and the words a row is shown in (`transition_line`, `contradiction_note`,
`reuse_note`, `infrastructure_note`: the text report, Markdown and the page say them
alike); builders from stored rows live in `service.report`, the routes in `service.api`;
table models (`service.models`) never go on the wire; the runner contract (what runners
send and receive) lives in `contract.wire`, not here. Pure pydantic: the client
(`bisect-cli submit`, `status`, ...) reads the API's answers into these models without
the server extra.
"""

from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import (
    MISSING,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from contract.wire import Cause, Sample
from service.options import MAX_REPEATS, JobOptions


class JobCreate(JobOptions):
    """A bisection request, the same from `bisect-cli run`, `submit` and REST.

    Unknown fields are refused: a misspelt option must not be silently ignored.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[assignment]

    range: str = Field(
        "",
        description="GOOD..BAD (find-fix: OLD..NEW), both ends included; not with --from/--to",
        max_length=200,
        validate_default=True,
    )

    @field_validator("range")
    @classmethod
    def _range(cls, value: str) -> str:
        # Missing, or given with --from/--to: `_env_policy` (service/envpolicy.py) has said so.
        if not value:
            return value
        good, sep, bad = value.partition("..")
        if not sep or not good.strip() or not bad.strip():
            raise ValueError(f"{value!r} is not a range; write GOOD..BAD, e.g. 1.0.0..1.0.9")
        return f"{good.strip()}..{bad.strip()}"

    @property
    def bounds(self) -> tuple[str, str]:
        good, _, bad = self.range.partition("..")
        return good, bad


class AgainRequest(BaseModel):
    """`POST /jobs/{id}/again` (and the page's buttons): see `service.actions.again_job`."""

    model_config = {"extra": "forbid"}

    repeats: Annotated[int | None, Field(ge=1, le=MAX_REPEATS)] = None
    candidate: Annotated[str | None, Field(max_length=200)] = None


class JobCreated(BaseModel):
    """What a submission answers: the job's API URL (`url`, what a client reads) and its
    status page (`page_url`, what a person opens)."""

    id: int
    url: str = Field(description="the job's report in the API: GET it for the job's state")
    page_url: str = Field(description="the job's status page, for a person to open")
    status: str


class JobSummary(BaseModel):
    id: int
    url: str | None  # None: read from a local results database (no server to link to)
    status: str
    message: str | None
    package: str
    range: str
    find_fix: bool
    requires_gpu: bool
    created_at: datetime
    finished_at: datetime | None
    result: dict[str, Any] | None
    owner: str | None = None


class JobPage(BaseModel):
    items: list[JobSummary]
    total: int
    limit: int
    offset: int


class TrialPublic(BaseModel):
    id: int  # the id in /trials/{id} paths
    job_id: int
    number: int  # the trial's number in its job (1, 2, ...), the one users are shown
    candidate_id: int
    version: str
    evaluation: int
    status: str
    attempt: int
    runner_id: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None
    env_seconds: float | None
    exit_code: int | None
    oom_killed: bool
    timed_out: bool
    cap_method: str | None
    gpu_source: str | None
    verdict: str | None
    error: str | None
    analysis: dict[str, Any] | None
    log_tail: str | None


class TrialSamples(BaseModel):
    trial_id: int
    samples: list[Sample]
    total: int  # the trial's samples in all (not only this page)
    offset: int
    limit: int
    max_points: int | None = None  # set when this page was downsampled


class CompleteAck(BaseModel):
    verdict: str | None  # None for a resolve trial


class ReturnAck(BaseModel):
    trial_id: int
    status: str


def boundary_names(find_fix: bool) -> tuple[str, str]:
    """A reader's names of the planner's (last_old, first_new) pair."""
    return ("last_bad", "first_good") if find_fix else ("last_good", "first_bad")


class CandidateRow(BaseModel):
    position: int
    version: str
    verdict: str | None
    yanked: bool
    yanked_reason: str | None = None
    testable: bool
    untestable_reason: str | None = None
    trials: int
    growth_mib: float | None = None
    upload_time: str | None = None  # ISO 8601, as the index gave it
    resolution: str | None = None
    # Why it was not held at the pins (with --base-env: which base pins it forced).
    resolution_note: str | None = None
    reused: bool = False
    # The earlier job whose verdict was copied, when it is the same owner's; None when not
    # reused or copied from another owner of the trust group (never named to this one).
    reused_from_job: int | None = None
    # Another job's verdict of this release disagrees with this one's (same reuse key and
    # owners, service/reuse.py rule 6): the verdict is flaky and never reused again.
    contradicted: bool = False
    # That other job, when it is the same owner's; None for a job of another owner of the
    # trust group (an owner sees only their own jobs' ids). `report.contradiction_note`.
    contradicted_by_job: int | None = None
    # An error verdict: the line its last failed run ended on (engine/crash.py).
    error: str | None = None
    # A shell line that rebuilds the candidate as tested and runs the repro (tested ones).
    reproduce: str | None = None
    # "pooled over N runs: ...": its latest evaluation's runs judged together
    # (engine/pooled.py); None when that evaluation had fewer than two runs to pool.
    pooled: str | None = None
    # Its trial's infrastructure failures ended the job (`Report.infrastructure`): the
    # note `infrastructure_note` words; None for every other release.
    infrastructure: str | None = None


# How the views name a job of another owner of the trust group.
GROUP_JOB = "a job of this trust group"


def contradiction_note(row: CandidateRow) -> str | None:
    """The note of a contradicted verdict: by job N, or by `GROUP_JOB` when N is another
    owner's."""
    if row.contradicted_by_job is not None:
        return f"flaky: contradicted by job {row.contradicted_by_job}"
    return f"flaky: contradicted by {GROUP_JOB}" if row.contradicted else None


def infrastructure_note(tries: int, runners: int) -> str:
    """The note of the release whose trial the infrastructure failed until the job ended
    (the text report, Markdown and the page say it alike)."""
    on = f" on {runners} runners" if runners > 1 else ""
    return f"no verdict: the infrastructure failed it {tries} times{on}"


def reuse_note(row: CandidateRow) -> str | None:
    """The note of a copied verdict: from job N, or from an earlier job of the trust group
    when N is another owner's (the page's sentence; `candidate_rows` knows N only with
    `links`)."""
    if not row.reused:
        return None
    if row.reused_from_job is not None:
        return f"verdicts reused from job {row.reused_from_job}"
    return "verdicts reused from an earlier job of this trust group"


class RunEvidence(BaseModel):
    trial: int  # the trial's number in its job (1, 2, ...), as users count them
    trial_id: int  # its id in the API's paths (/api/v1/trials/{trial_id}/samples)
    verdict: str | None
    exit_code: int | None
    oom_killed: bool
    duration_s: float | None
    analysis: dict[str, Any] | None
    error: str | None = None  # the line a crashed run ended on
    # Why the runner ended the run early (contract/earlystop.py); None: it ran to its end.
    stopped_early: str | None = None


class Evidence(BaseModel):
    version: str
    verdict: str | None
    runs: list[RunEvidence]
    # The pooled verdict of the latest evaluation with its numbers (`PooledAnalysis.to_dict`
    # plus "evaluation"); its "reason" starts "pooled over N runs: ".
    pooled: dict[str, Any] | None = None


class TransitionRow(BaseModel):
    """One leak/no-leak transition of the range (engine/planner.py rule 6)."""

    before: str  # the last release judged in the earlier state
    after: str  # the first release judged in the other state
    change: str  # "starts leaking" | "stops leaking" (at `after`)
    confirmed: bool  # both releases judged twice
    between: list[str] = Field(default_factory=list)  # untested or unjudgeable releases


def transition_line(row: TransitionRow) -> str:
    """One transition in words, the same in the text report, Markdown and the page."""
    where = ", ".join([*row.between, row.after])
    at = f"at one of {where}" if row.between else f"at {row.after}"
    confirmed = "" if row.confirmed else ", not re-run to confirm"
    return f"{row.change} {at}, after {row.before}{confirmed}"


class InfrastructureStop(BaseModel):
    """The infrastructure failure a job ended on (service/queue.py, infrastructure rules):
    never a verdict of the release. `cause`, `host` and `rule` are the runner's latest
    `contract.wire.Failure` (the host and the rule's words where the job's outbound rule
    refused it); `tries` how often it failed, on how many `runners`."""

    version: str
    trial: int
    tries: int
    runners: int
    cause: Cause
    host: str | None = None
    rule: str | None = None
    message: str


class FindFirstChange(BaseModel):
    """A package whose version differs between the pair of a find-first job; None: absent
    from that release's environment."""

    package: str
    last_good: str | None
    first_bad: str | None

    @property
    def old(self) -> str | None:
        return self.last_good

    @property
    def new(self) -> str | None:
        return self.first_bad


class FindFixChange(BaseModel):
    """The same for a find-fix job, whose pair is (last bad, first good)."""

    package: str
    last_bad: str | None
    first_good: str | None

    @property
    def old(self) -> str | None:
        return self.last_bad

    @property
    def new(self) -> str | None:
        return self.first_good


def dependency_change(
    find_fix: bool, package: str, old: str | None, new: str | None
) -> FindFirstChange | FindFixChange:
    """A row of `Report.dependency_diff`, named as the job's pair is."""
    if find_fix:
        return FindFixChange(package=package, last_bad=old, first_good=new)
    return FindFirstChange(package=package, last_good=old, first_bad=new)


_PAIR_DOC = "= {stable} for {mode} jobs (absent in {other} ones): the name a reader expects"


def _reader_name(stable: str, mode: str, other: str) -> Any:
    """One of the four reader-named copies of the pair: present in one mode only."""
    doc = _PAIR_DOC.format(stable=stable, mode=mode, other=other)
    return Field(default=MISSING, description=doc)


class Report(BaseModel):
    """A job's result. Field names never depend on the job: `find_fix` says which question
    was asked and `last_old`/`first_new` hold the answer's pair in the planner's terms.

    For readers (and every client written before these names), the pair is also shown under
    the mode's own names: `last_good`/`first_bad` for find-first jobs, `last_bad`/`first_good`
    for find-fix ones; the other two are absent (pydantic's MISSING: not on the wire, not
    required in the OpenAPI schema). They are derived, never set apart from the pair.
    `dependency_diff` rows are typed by mode in the same way (`FindFirstChange` or
    `FindFixChange`). A report in the older reader-named form validates too.
    """

    job_id: int | None
    status: str
    message: str | None = None
    package: str
    range: str
    find_fix: bool = Field(
        default=False,
        description="false: find the first release that leaks (last good, first bad); "
        "true: the first that stops leaking (last bad, first good)",
    )
    last_old: str | None = Field(
        default=None, description="the last release in the range's first state; None: not found"
    )
    first_new: str | None = Field(
        default=None, description="the first release in the other state; None: not found"
    )
    last_good: str | None | MISSING = _reader_name("last_old", "find-first", "find-fix")
    first_bad: str | None | MISSING = _reader_name("first_new", "find-first", "find-fix")
    last_bad: str | None | MISSING = _reader_name("last_old", "find-fix", "find-first")
    first_good: str | None | MISSING = _reader_name("first_new", "find-fix", "find-first")
    between: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    # Non-monotone ranges: one sentence naming the releases whose verdicts disagree with a
    # single boundary (None: they fit one), those releases, and every transition the
    # verdicts show (all of them with --all-transitions). The status is the first one's.
    not_monotone: str | None = None
    disagree: list[str] = Field(default_factory=list)
    transitions: list[TransitionRow] = Field(default_factory=list)
    candidates: list[CandidateRow] = Field(default_factory=list)
    trials: int = 0
    dependency_diff: list[FindFirstChange | FindFixChange] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)
    reproduce: str | None = None
    machine: dict[str, Any] | None = None
    # How the packages besides the bisected one were chosen, and why (engine/resolution.py).
    environment: str | None = None
    # The stages before and after the releases (service/stages.py), as the job stored them:
    # --from/--to's minimal set of changes and its mixes, --attribute's growing stacks,
    # --commits' first bad commit. None where the job had no such stage.
    dependency: dict[str, Any] | None = None
    attribution: dict[str, Any] | None = None
    commit: dict[str, Any] | None = None
    # The job ended (status "error", the message says it first) because a trial's
    # infrastructure failures persisted: a refused host, an index's error, a full disk.
    infrastructure: InfrastructureStop | None = None

    @property
    def names(self) -> tuple[str, str]:
        return boundary_names(self.find_fix)

    @model_validator(mode="before")
    @classmethod
    def _from_reader_names(cls, data: Any) -> Any:
        """The older form (the pair under the mode's names only) to the stable pair."""
        if not isinstance(data, dict) or "last_old" in data or "first_new" in data:
            return data
        old, new = boundary_names(bool(data.get("find_fix")))
        return {**data, "last_old": data.get(old), "first_new": data.get(new)}

    @model_validator(mode="after")
    def _reader_names(self) -> Self:
        """The mode's names copy the pair; the other mode's are absent."""
        for name in (*boundary_names(False), *boundary_names(True)):
            setattr(self, name, MISSING)
        old, new = self.names
        setattr(self, old, self.last_old)
        setattr(self, new, self.first_new)
        row_type = FindFixChange if self.find_fix else FindFirstChange
        if any(not isinstance(row, row_type) for row in self.dependency_diff):
            raise ValueError(f"dependency_diff rows of this job name the pair {old}, {new}")
        return self

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict (the `--json` output)."""
        return self.model_dump(mode="json")


class RunningTrial(BaseModel):
    """A run a runner holds now, as its status line shows it (contract/live.py); the
    memory fields are as of its last heartbeat, None before the first or where its runner
    did not say."""

    trial: int  # its number in the job
    trial_id: int
    version: str
    runner: str | None
    attempt: int
    started_at: datetime | None = Field(description="when its runner leased it")
    elapsed_s: float | None = Field(
        description="seconds since `started_at` by the server's clock, so a client's own "
        "clock does not matter"
    )
    rss: int | None = Field(description="bytes at the last heartbeat; None before the first")
    steps: int | None = Field(description="the steps its step markers span so far")
    floor_first: int | None = Field(description="bytes: its first complete step's floor")
    floor: int | None = Field(description="bytes: its latest complete step's floor")
    early_stop: str = Field(
        description="what the early-stop rule can do now, in words: off, cap only, "
        "from step N, looking"
    )


class Progress(BaseModel):
    candidates: int
    judged: int
    trials_done: int
    trials_running: int
    trials_queued: int
    running: list[RunningTrial] = Field(default_factory=list)


class JobPublic(Report):
    """The report plus where the job stands: what `GET /jobs/{id}` answers."""

    progress: Progress
    created_at: datetime
    finished_at: datetime | None

    def report(self) -> Report:
        """The report alone (the same as `bisect-cli run --json` prints)."""
        return Report.model_validate(self.model_dump(include=set(Report.model_fields)))


class WebhookAttempt(BaseModel):
    """One attempt to deliver a webhook (service/webhooks.py rule 7)."""

    at: datetime
    result: str = Field(description="'HTTP 200', 'HTTP 500', or the error, in one line")
    status: int | None = Field(description="the receiver's HTTP status; None: no answer")
    excerpt: str | None = Field(
        default=None, description="the start of the receiver's answer, printable, at most 200"
    )
    next_at: datetime | None = Field(description="when the next attempt is due; None: no more")


class WebhookDeliveryPublic(BaseModel):
    """A webhook a job's end sends (`GET /jobs/{id}/webhooks`, the job's page)."""

    id: int = Field(description="sent as the payload's `delivery`: retries repeat it")
    url: str | None = Field(description="the job's --webhook URL; None: the operator's (unshown)")
    status: str = Field(description="pending, delivered or failed (every attempt failed)")
    next_at: datetime | None
    attempts: list[WebhookAttempt]
