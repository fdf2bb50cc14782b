"""Wire models shared by the service and the runners.

A runner receives a `TrialSpec`, builds the environment, runs the script
under the sampler and answers with a `TrialReport`. Nothing here touches a
database, so runners can import it without the service's storage.

Rules for what a runner sends (registration, heartbeat, report, return), in code order:

1. Every model here is a `Wire` model: no float may be NaN or infinite.
2. Every integer is within 64 bits and within its meaning (a count or a size is not
   negative, an exit status is -255..255, an attempt fits its column): the `MAX_*`
   constants below say each bound once and why.
3. Every text and list has a length cap; free-form JSON (a profile, a GPU's description)
   is `bounded_json`: finite numbers, 64-bit integers, a nesting and a size limit.

So a runner that sends garbage is refused (the API answers 422 naming the field) before
anything is stored, and nothing it sends can make a later request fail.
"""

import errno
import json
import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from contract.outbound import Reach

# Every endpoint of the API is under this path (docs/api.md).
API_PREFIX = "/api/v1"
# The header a runner sends its secret in (from `RunnerRegistered.runner_secret`).
RUNNER_SECRET_HEADER = "X-Runner-Secret"
# The header a client names a submission with, so that a retried POST /jobs is not a new job.
IDEMPOTENCY_HEADER = "Idempotency-Key"
# A report carries at most this many samples; a longer trial is downsampled on the runner
# (`contract.series.downsample`: min and max of each bucket, so floors and spikes survive).
MAX_REPORT_SAMPLES = 20_000
# Bytes no single sample can exceed (1 PiB): anything larger is a broken or forged report.
MAX_SAMPLE_BYTES = 1 << 50

# ---- bounds on what a runner sends (rules 2 and 3); each far above any honest value.
# The largest 64-bit signed integer: what a BIGINT column (ids, sizes) can hold.
INT64_MAX = (1 << 63) - 1
# A lease's attempt number: Trial.attempt is a 32-bit INTEGER column on Postgres.
MAX_ATTEMPT = (1 << 31) - 1
# An exit status: 0..255 from exit(), -1..-255 for a signal (Python's returncode).
MAX_EXIT_CODE = 255
# A step marker's number or a count of samples: 2^62 leaves sums of a few within 64 bits.
MAX_STEP = 1 << 62
# Seconds a trial or its build can last: far above any job's timeout (a week at most,
# service/options.py) plus its build; 30 days is a broken clock or a forgery. A finite
# bound also keeps 2 x duration (the next run's hint, service/specs.py) finite.
MAX_SECONDS = 30 * 24 * 3600.0
# An error message, a resolution note: a few lines of uv's stderr (runners/uvrun.py keeps
# its last 20); an 8 MB error once made a 16.8 MB job page.
MAX_ERROR = 16 * 1024


def clip(text: str | None, limit: int = MAX_ERROR) -> str | None:
    """`text` cut to the last `limit` characters, where the reason usually is (uv's and
    git's stderr end with it): a runner clips its own messages so an honest report always
    fits the bound the API holds every runner to (a longer one is refused as garbage)."""
    if text is None or len(text) <= limit:
        return text
    cut = ""
    while True:  # the note's own length changes how much is cut: settle it
        note = f"[... {len(text) - (limit - len(cut))} characters cut ...]\n"
        if note == cut:
            return cut + text[-(limit - len(cut)) :]
        cut = note


# One requirement or `name==version` pin (the same cap as a job's requirements).
MAX_LINE = 2000
# Pins or frozen packages of one environment (the resolve report's cap).
MAX_PINS = 5000
# A file path on the runner (Linux PATH_MAX).
MAX_PATH = 4096
# A name or id: a runner's name and id, a label, a GPU driver or CUDA version.
MAX_NAME = 200
# A one-word code: cap_method, gpu_source, resolution.
MAX_WORD = 40
# Free-form JSON (`bounded_json`): an attribution profile is at most 60 stacks of 100
# frames (runners/tracehelper.py MAX_STACKS, MEMRAY_FRAMES) and 24 sizes each, about
# 2 MB of JSON with long native names; its nesting is 5 deep.
MAX_PROFILE_BYTES = 4 * 1024 * 1024
MAX_JSON_DEPTH = 32
# A GPU's description at registration (name, memory, uuid), and GPUs per runner.
MAX_GPU_BYTES = 4096
MAX_GPUS = 64


def _bounded(value: Any, max_bytes: int) -> Any:
    """`value` (parsed JSON) if it is finite, within 64 bits, `MAX_JSON_DEPTH` deep and
    `max_bytes` long as JSON; else ValueError naming the first fault (iterative: a deep
    value never costs a recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, float) and not math.isfinite(node):
            raise ValueError("not a finite number (NaN or Infinity)")
        if isinstance(node, int) and not -INT64_MAX - 1 <= node <= INT64_MAX:
            raise ValueError("an integer outside 64 bits")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1) for v in node)
    if len(json.dumps(value)) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes of JSON")
    return value


def bounded_json(max_bytes: int) -> AfterValidator:
    """The validator of a free-form JSON field (rule 3), `max_bytes` long at most."""
    return AfterValidator(lambda value: _bounded(value, max_bytes))


def _short_labels(labels: dict[str, str]) -> dict[str, str]:
    if any(len(k) > MAX_NAME or len(v) > MAX_NAME for k, v in labels.items()):
        raise ValueError(f"a key or value is longer than {MAX_NAME} characters")
    return labels


# A line of a list (a pin, a frozen package), a short code, a name (rule 3).
Line = Annotated[str, Field(max_length=MAX_LINE)]
Name = Annotated[str, Field(max_length=MAX_NAME)]
Word = Annotated[str, Field(max_length=MAX_WORD)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Attempt = Annotated[int, Field(ge=0, le=MAX_ATTEMPT)]


class Wire(BaseModel):
    """The base of every wire model: no float is NaN or infinite (rule 1)."""

    model_config = ConfigDict(allow_inf_nan=False)


class TrialKind(StrEnum):
    """What a trial does on its runner: the one definition (the service's table stores it,
    the spec carries it; service/kinds.py and runners/kinds.py each hold one handler per
    kind)."""

    # Build the candidate's environment and run the script under the sampler.
    RUN = "run"
    # Only resolve the candidate's requirements (`uv pip compile`) and report the pins every
    # other candidate is then held at; resolution may build sdists, so it runs on a runner.
    RESOLVE = "resolve"
    # Run the script once more under an allocation tracer (`TrialSpec.trace`) and report
    # per-stack growth (`TrialReport.attribution`); never judged, never a verdict.
    ATTRIBUTE = "attribute"
    # List the commits between two release tags of a repository (`TrialSpec.commit_range`,
    # runners/commits.py) and report them (`TrialReport.commits`); nothing runs or builds.
    COMMITS = "commits"


# The allocation tracers of an attribute trial, cheaper first: native and Python stacks
# (memray), or Python stacks only (tracemalloc; engine/attribution.py rule 6).
Tracer = Literal["memray", "tracemalloc"]
TRACERS: tuple[Tracer, ...] = get_args(Tracer)


class EnvSpec(Wire):
    """Everything that decides the contents of one candidate's environment."""

    package: str
    version: str
    python: str | None = None
    requirements: list[str] = Field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    find_links: list[str] = Field(default_factory=list)
    pre: bool = False
    # Pins (`name==version`) the other packages are held at; empty means free resolution.
    constraints: list[str] = Field(default_factory=list)
    # Resolve "as released": nothing uploaded after this instant is considered.
    exclude_newer: datetime | None = None
    # The constraints are the user's whole environment (`--base-env`): install every one
    # of them too, and leave only the pins a candidate cannot have (runners/envs.py).
    base_env: bool = False
    # With `base_env`: hold every pin exactly (a `--from/--to` mix): a mix that uv cannot
    # resolve fails to build (`EnvResult.unresolvable`), a skip; no pin is ever loosened.
    strict: bool = False
    # Build the package from this direct reference instead of `package==version`
    # (`--commits`): `git+URL@SHA`, or `git+file:///clone@SHA` (`bisect-cli run` only).
    source: str | None = Field(default=None, max_length=2000)
    # Where the URLs above may lead (contract/outbound.py): the runner checks them against
    # the addresses they resolve to before uv starts. None: the user's own job, anything.
    # Not part of the environment's hash (runners/envs.py): it decides no content.
    reach: Reach | None = None


class CommitRange(Wire):
    """What a "commits" trial lists: `repo` from `package`'s `good` tag to its `bad` one."""

    repo: str = Field(min_length=1, max_length=2000)
    package: str = Field(min_length=1, max_length=200)
    good: str = Field(min_length=1, max_length=200)
    bad: str = Field(min_length=1, max_length=200)
    # Where `repo` may lead (contract/outbound.py): checked against its resolved addresses
    # before git starts, git's own words withheld. None: the user's own job, anything.
    reach: Reach | None = None


class CommitInfo(Wire):
    sha: str = Field(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")  # SHA-1, or SHA-256 repos
    subject: str = Field(max_length=1000)


# A "commits" report lists at most this many (runners/commits.py `MAX_COMMITS`).
MAX_REPORT_COMMITS = 5000


class Cause(StrEnum):
    """Why a build or a run gave no verdict of the release: the one list, three owners.

    The infrastructure's (`infrastructure`): the runner's trouble, never the release's or
    the script's. The service retries the trial without using an attempt, on another
    runner where one is live, and ends the job naming the cause when it persists
    (service/queue.py, infrastructure rules); never a skip, never untestable.

    The release's: the environment truly cannot be built (a skip, stepped around; at a
    bound the job says which). The script's: its own exit 125 (a skip as well).

    The runner decides the cause from what it knows for sure (runners/uvrun.py `classify`,
    in this order): the egress proxy's own refusals, then the hosts it could not connect
    to, uv's timeout, no space left on the device (uv's words or the runner's own
    ``ENOSPC``), uv's words for a failed request, and last uv's resolver.
    """

    # Infrastructure.
    REFUSED = "refused"  # the job's outbound rule refused a host uv asked for
    UNREACHABLE = "unreachable"  # a host did not answer (connect, name lookup)
    INDEX_ERROR = "index-error"  # an index or a file host answered an HTTP error status
    TIMED_OUT = "timed-out"  # uv did not finish within its time
    DISK_FULL = "disk-full"  # no space left on the runner's device
    # The release's.
    NO_RESOLUTION = "no-resolution"  # uv found no set of versions that fits
    NO_DISTRIBUTION = "no-distribution"  # no wheel or sdist for this platform or Python
    BUILD_FAILED = "build-failed"  # the release's sdist (or commit) did not build
    # The script's.
    SCRIPT_SKIP = "exit-125"  # the script exited 125: it says it cannot test the release

    @property
    def infrastructure(self) -> bool:
        return self in _INFRASTRUCTURE


_INFRASTRUCTURE = frozenset(
    {Cause.REFUSED, Cause.UNREACHABLE, Cause.INDEX_ERROR, Cause.TIMED_OUT, Cause.DISK_FULL}
)


class Failure(Wire):
    """A failed build or trial and its `Cause`, as the job may be told it (docs/security.md,
    what a job is told): `message` is one line; `host` (``host:port``) and `rule` (the
    outbound rule's own words) where the cause is a host, the rule's where it refused."""

    cause: Cause
    message: str = Field(max_length=MAX_ERROR)
    host: Name | None = None
    rule: str | None = Field(default=None, max_length=MAX_LINE)

    @classmethod
    def from_exception(cls, exc: BaseException) -> Self | None:
        """The failure an exception on the runner is, when it is one of the infrastructure:
        ``ENOSPC`` (no space left on the device); else None (the runner's own error)."""
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            where = f" ({exc.filename})" if exc.filename else ""
            return cls(cause=Cause.DISK_FULL,
                       message=f"no space left on the runner's device{where}")  # fmt: skip
        return None


class EnvResult(Wire):
    """The outcome of building one environment."""

    ok: bool
    path: str | None = Field(default=None, max_length=MAX_PATH)
    python_executable: str | None = Field(default=None, max_length=MAX_PATH)
    freeze: list[Line] = Field(default_factory=list, max_length=MAX_PINS)
    # "constrained" (held at the good bound's pins), "free" (fallback or no pins),
    # "as-released", or "strict" (a strict mix: every pin held exactly, `EnvSpec.strict`).
    resolution: Word = "free"
    resolution_note: str | None = Field(default=None, max_length=MAX_ERROR)
    reused: bool = False
    seconds: Seconds = 0.0
    error: str | None = Field(default=None, max_length=MAX_ERROR)
    # uv found no solution for the pins (a strict mix): the mix is invalid, not guilty.
    unresolvable: bool = False
    # Why it failed (`Cause`); None: a build that succeeded, or a runner from before causes
    # (the service then reads a failed build as the release's, as it always did).
    failure: Failure | None = None


class Sample(Wire):
    """One memory sample. Bytes; `None` means the source did not say, never zero."""

    t: float = Field(ge=0)  # seconds since the trial's script started (finite: rule 1)
    rss: int = Field(ge=0, le=MAX_SAMPLE_BYTES)
    anon: int | None = Field(default=None, ge=0, le=MAX_SAMPLE_BYTES)
    shared: int | None = Field(default=None, ge=0, le=MAX_SAMPLE_BYTES)
    gpu: int | None = Field(default=None, ge=0, le=MAX_SAMPLE_BYTES)
    step: int | None = Field(default=None, ge=0, le=MAX_STEP)  # the last step marker seen


# The shortest horizon a trial may stop early on (contract/earlystop.py rule 2 says why 60 s).
# Here, with the settings it bounds, so that a client (the job options' help) reads it
# without the early-stop rules' numpy.
MIN_HORIZON_S = 60.0


class EarlyStop(Wire):
    """How a trial may end early (contract/earlystop.py has the rules).

    The thresholds are the job's classifier settings (engine/analysis.py
    `ClassifierSettings`, same names and defaults); the horizon is the longest run of
    the job that went to its end (service/specs.py `horizon`), None while there is none.
    """

    horizon_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    horizon_steps: int | None = Field(default=None, ge=1)
    # Stop when the trial holds this share of its memory cap with a rising floor.
    cap_fraction: float = Field(default=0.9, gt=0, le=1)
    # No leak look before this share of the horizon is observed.
    min_fraction: float = Field(default=0.5, gt=0, le=1)
    look_every_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    # The growth's lower bound must clear margin x T.
    margin: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    warmup_fraction: float = 0.2
    warmup_steps: int = 2
    warmup_step_fraction: float = 0.05
    min_blocks: int = Field(default=6, ge=3)
    max_blocks: int = Field(default=30, ge=3)
    block_samples: int = Field(default=20, ge=1)
    min_block_samples: int = Field(default=3, ge=1)
    floor_percentile: float = Field(default=10.0, ge=0, le=100)
    min_growth_mib: float = Field(default=8.0, ge=0)
    min_growth_fraction: float = Field(default=0.05, ge=0)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    late_fraction: float = Field(default=1 / 3, gt=0, le=1)
    late_min_blocks: int = Field(default=3, ge=2)
    leak_late_ratio: float = Field(default=0.5, gt=0, le=1)
    saturation_ratio: float = Field(default=0.35, ge=0, le=1)
    max_drop_ratio: float = Field(default=1.0, gt=0)


class TraceStop(Wire):
    """When an attribute trial's traced run ends before its script does
    (engine/attribution.py rules 7 and 8; runners/tracehelper.py stops it): after
    `markers` step markers (enough for the comparison), or `seconds` after it started
    (its budget); None: no such limit."""

    markers: int | None = Field(default=None, ge=1)
    seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class TrialSpec(Wire):
    trial_id: int
    attempt: int = 1
    kind: TrialKind = TrialKind.RUN
    env: EnvSpec
    script: str
    script_name: str = "repro.py"
    timeout_s: float = 600.0
    memory_limit_bytes: int | None = None
    sample_hz: float = 10.0
    requires_gpu: bool = False
    # The job's own environment variables for the script; the runner adds only its allowlist.
    variables: dict[str, str] = Field(default_factory=dict)
    # None: the trial runs to its end (the job turned early stopping off).
    early_stop: EarlyStop | None = None
    # Attribute trials: the tracer to run the script under (runners/tracing.py), and when
    # the traced run ends before the script does (None: at its end or the timeout).
    trace: Tracer | None = None
    trace_stop: TraceStop | None = None
    # Commits trials: what to list.
    commit_range: CommitRange | None = None
    # Whose job this is: builds use that owner's own uv cache and environments, so a hostile
    # build backend can poison nothing another owner runs (docs/security.md). None: a local
    # run (`bisect-cli run`), whose only owner is the user running it.
    owner: str | None = Field(default=None, max_length=200)


class EarlyStopRecord(Wire):
    """What the early-stop rule had to go on in one run trial (contract/earlystop.py): the
    horizon it was sent and how many leak looks it actually tested. The service stores it
    as the trial's analysis["early_stop"]; verdict reuse reads it (service/reuse.py)."""

    horizon_s: Seconds | None = None
    horizon_steps: int | None = Field(default=None, ge=0, le=MAX_STEP)
    looks: int = Field(default=0, ge=0, le=1_000_000)


class TrialReport(Wire):
    trial_id: int = Field(ge=0, le=INT64_MAX)
    attempt: Attempt = 1
    runner_id: Name | None = None
    env: EnvResult
    exit_code: int | None = Field(default=None, ge=-MAX_EXIT_CODE, le=MAX_EXIT_CODE)
    oom_killed: bool = False
    timed_out: bool = False
    cap_method: Word | None = None  # "cgroup-v1" | "cgroup-v2" | "watchdog"
    duration_s: Seconds = 0.0
    log_tail: str = Field(default="", max_length=64 * 1024)
    samples: list[Sample] = Field(default_factory=list, max_length=MAX_REPORT_SAMPLES)
    # How many samples the trial took; more than len(samples) when it was downsampled.
    samples_taken: int | None = Field(default=None, ge=0, le=MAX_STEP)
    # (t, step) for each step marker the script printed.
    steps: list[tuple[Seconds, Annotated[int, Field(ge=0, le=MAX_STEP)]]] = Field(
        default_factory=list, max_length=MAX_REPORT_SAMPLES
    )
    gpu_source: Word = "unavailable"  # process | device | unavailable
    host_source: Word = "psutil"
    error: str | None = Field(default=None, max_length=MAX_ERROR)
    # Resolve trials: the pins of the resolution (None for run trials, or when it failed).
    pins: list[Line] | None = Field(default=None, max_length=MAX_PINS)
    # Why the runner ended the trial early (contract/earlystop.py); None: it ran to its end.
    stopped_early: str | None = Field(default=None, max_length=2000)
    # The early-stop rule's horizon and looks in this run (None: it had no early-stop settings).
    early_stop: EarlyStopRecord | None = None
    # Attribute trials: the tracer's per-stack profile (engine/attribution.py `Profile`).
    attribution: Annotated[dict[str, Any], bounded_json(MAX_PROFILE_BYTES)] | None = None
    # Commits trials: the listed commits, oldest first (None when listing failed: `error`).
    commits: list[CommitInfo] | None = Field(default=None, max_length=MAX_REPORT_COMMITS)
    # The isolation this trial did not get where the kernel or the runner's rights lacked
    # it, one short phrase each (docs/security.md), e.g. "no network namespace".
    missing_protections: list[Name] = Field(default_factory=list, max_length=20)
    # A failure outside the build (`env.failure` has the build's): the runner's disk filled
    # while it prepared the run. None: none.
    failure: Failure | None = None

    @property
    def infrastructure(self) -> Failure | None:
        """The infrastructure failure this report is (`Cause.infrastructure`), if any: no
        outcome of the release, whatever else the report holds."""
        for failure in (self.failure, self.env.failure):
            if failure is not None and failure.cause.infrastructure:
                return failure
        return None

    @model_validator(mode="after")
    def _ordered_in_time(self) -> Self:
        times = [s.t for s in self.samples]
        if any(b < a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("samples: times must not decrease")
        return self


class RunnerCapabilities(Wire):
    # name, memory_bytes, uuid per GPU (runners/agent.py `describe_capabilities`)
    gpus: list[Annotated[dict[str, Any], bounded_json(MAX_GPU_BYTES)]] = Field(
        default_factory=list, max_length=MAX_GPUS
    )
    gpu_driver: Name | None = None
    cuda: Name | None = None
    memory_bytes: int = Field(default=0, ge=0, le=MAX_SAMPLE_BYTES)
    cpus: int = Field(default=1, ge=1, le=1 << 20)
    pythons: list[Word] = Field(default_factory=list, max_length=100)
    platform: Name = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


class RunnerRegister(Wire):
    name: str = Field(min_length=1, max_length=200)
    capabilities: RunnerCapabilities = Field(default_factory=RunnerCapabilities)
    labels: Annotated[dict[str, str], AfterValidator(_short_labels)] = Field(
        default_factory=dict, max_length=100
    )


class RunnerRegistered(Wire):
    runner_id: str
    # Sent back as X-Runner-Secret on every later request; shown once, stored only hashed.
    runner_secret: str
    lease_s: float
    heartbeat_s: float


class Lease(Wire):
    """A trial handed to one runner until `lease_expires_at`, extended by heartbeats."""

    trial: TrialSpec
    lease_expires_at: datetime
    heartbeat_s: float


class Heartbeat(Wire):
    """A runner's trial is still running: extend its lease. The rest is what its status line
    shows (`contract.live.LiveMemory`, the same names); None where the runner did not say (a
    runner from before these fields sends only `rss`)."""

    runner_id: Name
    attempt: Attempt
    # the trial's current memory, for the status page
    rss: int | None = Field(default=None, ge=0, le=MAX_SAMPLE_BYTES)
    # the steps its markers span so far, and the floor of its first and latest complete step
    steps: int | None = Field(default=None, ge=0, le=MAX_STEP)
    floor_first: int | None = Field(default=None, ge=0, le=MAX_SAMPLE_BYTES)
    floor: int | None = Field(default=None, ge=0, le=MAX_SAMPLE_BYTES)


class HeartbeatAck(Wire):
    lease_expires_at: datetime


class LeaseReturn(Wire):
    """A runner giving a trial back unfinished (shutting down); not counted as a failure."""

    runner_id: Name
    attempt: Attempt
