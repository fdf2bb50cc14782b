"""Wire models of the REST API that only the API uses (shared ones live in
service/schemas.py and contract/wire.py). Table models never go on the wire."""

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from contract.wire import Sample


class JobCreated(BaseModel):
    id: int
    url: str
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
