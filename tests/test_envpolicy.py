"""The environment policy as one union (service/envpolicy.py): what the flat fields read as."""

from datetime import UTC, datetime

import pytest
from pydantic import TypeAdapter, ValidationError

from service import envpolicy
from service.envpolicy import AsReleased, BaseEnv, EnvPair, EnvPolicy, ResolvedAt
from service.models import PinState
from service.pins import initial_state
from service.schemas import JobCreate

GOOD, BAD = "a==1\nb==1\n", "a==2\nb==1\n"
SEARCH = {"script": "pass\n", "package": "b", "range": "1..2"}
BOUNDS = (("1", datetime(2024, 1, 1, tzinfo=UTC)), ("2", datetime(2024, 6, 1, tzinfo=UTC)))


@pytest.mark.parametrize(
    ("fields", "policy", "state"),
    [
        (SEARCH, ResolvedAt(), PinState.PENDING),
        (SEARCH | {"resolve_at": " latest "}, ResolvedAt(at="latest"), PinState.PENDING),
        (SEARCH | {"as_released": True}, AsReleased(), PinState.NONE),
        (
            SEARCH | {"base_env": GOOD, "base_env_name": "base.txt"},
            BaseEnv(text=GOOD, name="base.txt"),
            PinState.RESOLVED,
        ),
        (
            {"script": "pass\n", "from_env": GOOD, "to_env": BAD, "to_env_name": "bad.txt"},
            EnvPair(good=GOOD, bad=BAD, bad_name="bad.txt"),
            PinState.NONE,
        ),
    ],
)
def test_the_flat_fields_read_as_one_kind(
    fields: dict[str, object], policy: EnvPolicy, state: PinState
) -> None:
    read = JobCreate(**fields).env_policy  # type: ignore[arg-type]
    assert read == policy
    assert initial_state(read) == state
    # The union is discriminated by `kind`: its JSON reads back as the same variant.
    adapter: TypeAdapter[EnvPolicy] = TypeAdapter(EnvPolicy)
    assert adapter.validate_json(adapter.dump_json(read)) == policy


def test_every_kind_answers_for_itself() -> None:
    good, newest = BOUNDS
    assert ResolvedAt().pins_as_of(good, newest) == newest[1]
    assert AsReleased().pins_as_of(good, newest) is None
    assert AsReleased().exclude_newer(newest[1], None) == newest[1]
    assert ResolvedAt().exclude_newer(newest[1], good[1]) == good[1]
    assert BaseEnv(text=GOOD).base_pins("a") == ["b==1"]
    assert (AsReleased.shared_pins, BaseEnv.holds_every_pin) == (False, True)
    assert EnvPair(good=GOOD, bad=BAD).labels == ("--from", "--to")
    assert EnvPair(good=GOOD, bad=BAD).pins() == ({"a": "1", "b": "1"}, {"a": "2", "b": "1"})


def test_every_rule_names_a_field_the_options_have() -> None:
    fields = set(JobCreate.model_fields)
    assert set(envpolicy.RULES) <= fields and set(envpolicy.CHOOSES) <= fields


def test_a_conflict_is_the_later_fields_error() -> None:
    with pytest.raises(ValidationError) as caught:
        JobCreate(**SEARCH, as_released=True, resolve_at="latest")  # type: ignore[arg-type]
    [error] = caught.value.errors()
    assert error["loc"] == ("resolve_at",)
