"""Wire models of jobs: what submissions carry and what the API and CLI show."""

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from service.options import JobOptions


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
    def _range(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("from_env") is not None:
            if value:
                raise ValueError("not with --from/--to: the two environments are the range")
            return value
        if not value:
            raise ValueError("missing; write GOOD..BAD, e.g. 1.0.0..1.0.9")
        good, sep, bad = value.partition("..")
        if not sep or not good.strip() or not bad.strip():
            raise ValueError(f"{value!r} is not a range; write GOOD..BAD, e.g. 1.0.0..1.0.9")
        return f"{good.strip()}..{bad.strip()}"

    @property
    def bounds(self) -> tuple[str, str]:
        good, _, bad = self.range.partition("..")
        return good, bad
