"""A runner's own long messages fit the bounds the API holds it to (contract/wire.py `clip`).

The API refuses a report whose error is longer than `MAX_ERROR` (issue 26 row 6), so a
runner cuts uv's or git's stderr, or an exception's text, before it builds the report;
otherwise an honest build failure with a long stderr would fail on the runner as a
ValidationError instead of reaching the job.
"""

import pytest
from pydantic import ValidationError

from contract.wire import MAX_ERROR, EnvResult, clip
from runners.kinds import built_env


def test_clip_keeps_the_tail_and_says_what_it_cut() -> None:
    text = "".join(f"line {i}\n" for i in range(20000)) + "error: the reason at the end"
    out = clip(text)
    assert out is not None and len(out) == MAX_ERROR
    assert out.endswith("error: the reason at the end")
    head = out.splitlines()[0]
    assert head.startswith("[... ") and head.endswith(" characters cut ...]")
    kept = out[len(head) + 1 :]
    assert text.endswith(kept)
    assert head == f"[... {len(text) - len(kept)} characters cut ...]"


def test_short_text_and_none_pass_through() -> None:
    assert clip(None) is None
    assert clip("x" * MAX_ERROR) == "x" * MAX_ERROR


def test_a_long_build_error_still_makes_a_valid_report() -> None:
    with pytest.raises(ValidationError):  # the bound the API holds every runner to
        EnvResult(ok=False, error="x" * (MAX_ERROR + 1))
    env = built_env({"error": "uv: " + "y" * 100_000 + " no solution"})
    assert env.error is not None and env.error.endswith(" no solution")
    assert len(env.error) == MAX_ERROR
    EnvResult.model_validate(env.model_dump(mode="json"))  # as the API reads it
