"""Wire models of the REST API that only the API uses (shared ones live in
service/schemas.py and runners/wire.py). Table models never go on the wire."""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runners.wire import Sample
from service.schemas import CandidatePublic


class JobCreated(BaseModel):
    id: int
    url: str
    status: str


class JobSummary(BaseModel):
    id: int
    url: str
    status: str
    message: str | None
    package: str
    range: str
    find_fix: bool
    requires_gpu: bool
    created_at: datetime
    finished_at: datetime | None
    result: dict[str, Any] | None


class JobPage(BaseModel):
    items: list[JobSummary]
    total: int
    limit: int
    offset: int


class RunningTrial(BaseModel):
    trial: int
    version: str
    runner: str | None
    attempt: int
    rss: int | None = Field(description="bytes at the last heartbeat; None before the first")


class Progress(BaseModel):
    candidates: int
    judged: int
    trials_done: int
    trials_running: int
    trials_queued: int
    running: list[RunningTrial] = Field(default_factory=list)


class JobPublic(BaseModel):
    """The report of service/report.py (the same dict as `bisect-cli run --json`) plus
    `progress`, `created_at` and `finished_at`. Boundary keys are `last_good`/`first_bad`,
    or `last_bad`/`first_good` for find-fix jobs; all report keys are passed through."""

    model_config = ConfigDict(extra="allow")

    job_id: int
    status: str
    message: str | None
    package: str
    range: str
    find_fix: bool
    candidates: list[CandidatePublic]
    trials: int
    progress: Progress
    created_at: datetime
    finished_at: datetime | None


class TrialPublic(BaseModel):
    id: int
    job_id: int
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


class CompleteAck(BaseModel):
    verdict: str


class ReturnAck(BaseModel):
    trial_id: int
    status: str
