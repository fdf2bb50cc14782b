"""The API's models: one module, stable names, every answer fully described by OpenAPI."""

from typing import Any

import pytest
from fastapi import FastAPI

from contract import wire
from service import schemas
from service.app import create_app
from service.schemas import FindFirstChange, FindFixChange, Report
from service.settings import Settings

REPORT = {"job_id": 1, "status": "found", "package": "leakyfixture", "range": "1.0.0..1.0.9"}


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(Settings(database_url="sqlite://"), migrate=False)


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


def test_the_job_report_endpoint_is_a_full_object_schema(app: FastAPI) -> None:
    """`GET /jobs/{id}` once answered `additionalProperties: true` (keys renamed by mode)."""
    spec = app.openapi()
    answer = spec["paths"]["/api/v1/jobs/{job_id}"]["get"]["responses"]["200"]
    schema = _resolve(spec, answer["content"]["application/json"]["schema"])
    assert schema.get("additionalProperties") is not True
    assert schema["type"] == "object"
    pair = {"find_fix", "last_old", "first_new", "last_good", "first_bad", "last_bad"}
    assert pair | {"first_good", "dependency_diff", "progress"} <= schema["properties"].keys()
    assert (
        not pair
        & {"last_good", "first_bad", "last_bad", "first_good"}
        & set(schema.get("required", []))
    )
    rows = schema["properties"]["dependency_diff"]["items"]["anyOf"]
    shapes = {frozenset(_resolve(spec, row)["required"]) for row in rows}
    assert shapes == {
        frozenset({"package", "last_good", "first_bad"}),
        frozenset({"package", "last_bad", "first_good"}),
    }


def test_no_answer_model_is_an_open_dict(app: FastAPI) -> None:
    spec = app.openapi()
    open_ = [
        name
        for name, schema in spec["components"]["schemas"].items()
        if schema.get("additionalProperties") is True and not schema.get("properties")
    ]
    assert open_ == []


def test_every_answer_is_a_model_of_the_one_module(app: FastAPI) -> None:
    """Client-facing models live in service/schemas.py; the runner contract in contract/wire.py."""
    spec = app.openapi()
    answers = {
        schema["$ref"].rsplit("/", 1)[1]
        for path in spec["paths"].values()
        for operation in path.values()
        for code, response in operation["responses"].items()
        if code.startswith("2")
        for media in response.get("content", {}).values()
        if "$ref" in (schema := media.get("schema", {}))
    }
    assert len(answers) > 5
    homes = {name: schemas if hasattr(schemas, name) else wire for name in answers}
    assert all(hasattr(home, name) for name, home in homes.items()), answers
    assert not hasattr(schemas, "TrialSpec") and not hasattr(wire, "JobPublic")


def test_a_find_fix_report_names_its_pair_once_each_way() -> None:
    report = Report.model_validate(
        {**REPORT, "find_fix": True, "last_old": "2.0", "first_new": "2.1"}
    )
    report.dependency_diff = [FindFixChange(package="numpy", last_bad="1.0", first_good=None)]
    wire = report.wire()
    assert (wire["last_old"], wire["first_new"]) == ("2.0", "2.1")
    assert (wire["last_bad"], wire["first_good"]) == ("2.0", "2.1")
    assert "last_good" not in wire and "first_bad" not in wire
    assert wire["dependency_diff"] == [{"package": "numpy", "last_bad": "1.0", "first_good": None}]
    assert Report.model_validate(wire) == report


def test_the_reader_named_form_still_reads() -> None:
    """Reports written before the stable pair (a server not yet upgraded) validate as before."""
    row = {"package": "numpy", "last_good": None, "first_bad": "2.0"}
    report = Report.model_validate(
        {**REPORT, "last_good": "1.0.5", "first_bad": "1.0.6", "dependency_diff": [row]}
    )
    assert (report.last_old, report.first_new) == ("1.0.5", "1.0.6")
    assert report.dependency_diff == [FindFirstChange(**row)]
    assert (report.dependency_diff[0].old, report.dependency_diff[0].new) == (None, "2.0")


def test_rows_named_for_the_other_mode_are_refused() -> None:
    row = {"package": "numpy", "last_good": None, "first_bad": "2.0"}
    with pytest.raises(ValueError, match="last_bad, first_good"):
        Report.model_validate({**REPORT, "find_fix": True, "dependency_diff": [row]})
