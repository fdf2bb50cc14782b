"""service/http/errors.py: a validation error names the field it is about."""

from fastapi.exceptions import RequestValidationError

from service.http.errors import validation_detail


def _detail(*locs: tuple[object, ...]) -> str:
    return validation_detail(
        RequestValidationError([{"loc": loc, "msg": "bad", "type": "value_error"} for loc in locs])
    )


def test_where_the_value_came_from_is_dropped_and_a_field_named_path_is_kept() -> None:
    assert _detail(("body", "env", "path")) == "env.path: bad"
    assert _detail(("path", "trial_id")) == "trial_id: bad"
    assert _detail(("query", "offset"), ("body", "from_env", "path")) == (
        "offset: bad; from_env.path: bad"
    )
