"""Wire models of jobs: what submissions carry and what the API and CLI show."""

from datetime import datetime
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, Field, field_validator

from service.units import parse_size

MAX_SCRIPT_BYTES = 1024 * 1024


class JobCreate(BaseModel):
    """A bisection request, the same from `bisect-cli run`, `submit` and REST."""

    package: str = Field(min_length=1, max_length=200)
    range: str = Field(description="GOOD..BAD (find-fix: OLD..NEW), both ends included")
    script: str = Field(description="the repro script's text (at most 1 MiB)")
    script_name: str = "repro.py"
    python: str | None = None
    requirements: list[str] = Field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    find_links: list[str] = Field(default_factory=list)
    pre: bool = False
    skip_yanked: bool = False
    as_released: bool = False
    find_fix: bool = False
    repeats: int = Field(default=1, ge=1, le=20)
    max_runs: int = Field(default=3, ge=1, le=50)
    timeout_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    memory_limit: int | None = Field(
        default=None, description="bytes, or a size such as 8G; default: 80% of the runner's RAM"
    )
    sample_hz: float = Field(default=10.0, gt=0, le=100)
    requires_gpu: bool = False
    # Leak thresholds of the classifier; None keeps its documented default.
    min_growth_mib: float | None = Field(
        default=None, gt=0, description="absolute floor growth that counts as a leak (MiB)"
    )
    min_growth_fraction: float | None = Field(
        default=None, ge=0, description="relative floor growth that counts (of the baseline)"
    )
    reuse_verdicts: bool = Field(
        default=True,
        description="reuse verdicts of earlier jobs judged under the same conditions",
    )

    @field_validator("package")
    @classmethod
    def _package(cls, value: str) -> str:
        try:
            Requirement(value)
        except InvalidRequirement as exc:
            raise ValueError(f"{value!r} is not a package name") from exc
        if canonicalize_name(value) != canonicalize_name(Requirement(value).name):
            raise ValueError(f"{value!r} is not a package name")
        return value

    @field_validator("range")
    @classmethod
    def _range(cls, value: str) -> str:
        good, sep, bad = value.partition("..")
        if not sep or not good.strip() or not bad.strip():
            raise ValueError(f"{value!r} is not a range; write GOOD..BAD, e.g. 1.0.0..1.0.9")
        return f"{good.strip()}..{bad.strip()}"

    @field_validator("script")
    @classmethod
    def _script(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the script is empty")
        if len(value.encode()) > MAX_SCRIPT_BYTES:
            raise ValueError("the script is larger than 1 MiB")
        return value

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                Requirement(value)
            except InvalidRequirement as exc:
                reason = str(exc).splitlines()[0]
                raise ValueError(f"requirement {value!r} does not parse: {reason}") from exc
        return values

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _memory_limit(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)

    @property
    def classifier(self) -> dict[str, float]:
        """The classifier settings this job overrides."""
        names = ("min_growth_mib", "min_growth_fraction")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @property
    def bounds(self) -> tuple[str, str]:
        good, _, bad = self.range.partition("..")
        return good, bad


class CandidatePublic(BaseModel):
    position: int
    version: str
    verdict: str | None
    yanked: bool
    yanked_reason: str | None = None
    testable: bool
    untestable_reason: str | None = None
    trials: int
    growth_mib: float | None = None
    upload_time: datetime | None = None
    resolution: str | None = None
    reused: bool = False


class JobPublic(BaseModel):
    id: int
    status: str
    message: str | None
    package: str
    range: str
    find_fix: bool
    created_at: datetime
    finished_at: datetime | None
    progress: dict[str, int]
    candidates: list[CandidatePublic]
    result: dict[str, Any] | None
