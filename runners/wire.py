"""Wire models shared by the service and the runners.

A runner receives a `TrialSpec`, builds the environment, runs the script
under the sampler and answers with a `TrialReport`. Nothing here touches a
database, so runners can import it without the service's storage.
"""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class EnvSpec(BaseModel):
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


class EnvResult(BaseModel):
    """The outcome of building one environment."""

    ok: bool
    path: str | None = None
    python_executable: str | None = None
    freeze: list[str] = Field(default_factory=list)
    # "constrained" (held at the good bound's pins), "free" (fallback or no pins),
    # or "as-released".
    resolution: str = "free"
    resolution_note: str | None = None
    reused: bool = False
    seconds: float = 0.0
    error: str | None = None


class Sample(BaseModel):
    """One memory sample. Bytes; `None` means the source did not say, never zero."""

    t: float  # seconds since the trial's script started
    rss: int
    anon: int | None = None
    shared: int | None = None
    gpu: int | None = None
    step: int | None = None  # the last step marker seen at this instant, if any


class TrialSpec(BaseModel):
    trial_id: int
    attempt: int = 1
    env: EnvSpec
    script: str
    script_name: str = "repro.py"
    timeout_s: float = 600.0
    memory_limit_bytes: int | None = None
    sample_hz: float = 10.0
    requires_gpu: bool = False


class TrialReport(BaseModel):
    trial_id: int
    attempt: int = 1
    runner_id: str | None = None
    env: EnvResult
    exit_code: int | None = None
    oom_killed: bool = False
    timed_out: bool = False
    cap_method: str | None = None  # "cgroup-v1" | "cgroup-v2" | "watchdog"
    duration_s: float = 0.0
    log_tail: str = ""
    samples: list[Sample] = Field(default_factory=list)
    # (t, step) for each step marker the script printed.
    steps: list[tuple[float, int]] = Field(default_factory=list)
    gpu_source: str = "unavailable"  # "process" | "device" | "unavailable"
    host_source: str = "psutil"
    error: str | None = None


class RunnerCapabilities(BaseModel):
    gpus: list[dict[str, Any]] = Field(default_factory=list)  # name, memory_bytes per GPU
    gpu_driver: str | None = None
    cuda: str | None = None
    memory_bytes: int = 0
    cpus: int = 1
    pythons: list[str] = Field(default_factory=list)
    platform: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


class RunnerRegister(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    capabilities: RunnerCapabilities = Field(default_factory=RunnerCapabilities)
    labels: dict[str, str] = Field(default_factory=dict)


class RunnerRegistered(BaseModel):
    runner_id: str
    lease_s: float
    heartbeat_s: float


class Lease(BaseModel):
    """A trial handed to one runner until `lease_expires_at`, extended by heartbeats."""

    trial: TrialSpec
    lease_expires_at: datetime
    heartbeat_s: float


class Heartbeat(BaseModel):
    runner_id: str
    attempt: int
    rss: int | None = None  # the trial's current memory, for the status page


class HeartbeatAck(BaseModel):
    lease_expires_at: datetime


class LeaseReturn(BaseModel):
    """A runner giving a trial back unfinished (shutting down); not counted as a failure."""

    runner_id: str
    attempt: int
