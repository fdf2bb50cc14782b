"""Sizes and the job request's validation (pure)."""

import pytest
from pydantic import ValidationError

from engine.units import parse_size
from service.schemas import JobCreate


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4G", 4 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("1000", 1000),
        (" 2 gib ", 2 * 1024**3),
        (123, 123),
    ],
)
def test_parse_size(text, expected) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "12X", "-1G", "0", "1.5.2M"])
def test_parse_size_rejects(text) -> None:
    with pytest.raises(ValueError) as err:
        parse_size(text)
    assert (
        str(err.value)
        == f"{text!r} is not a positive size such as 4G, 512MiB, 1.5GB or a byte count"
    )


def request(**fields) -> JobCreate:
    base = {"package": "leakyfixture", "range": "1.0.0..1.0.9", "script": "print(1)"}
    return JobCreate(**{**base, **fields})


def test_job_create_normalises() -> None:
    job = request(range=" 1.0.0 .. 1.0.9 ", memory_limit="1G")
    assert job.bounds == ("1.0.0", "1.0.9")
    assert job.memory_limit == 1024**3
    assert job.classifier == {}


def test_thresholds_become_classifier_settings() -> None:
    job = request(min_growth_mib=64, min_growth_fraction=0.1)
    assert job.classifier == {"min_growth_mib": 64, "min_growth_fraction": 0.1}


@pytest.mark.parametrize(
    ("fields", "loc", "message"),
    [
        ({"range": "1.0.0"}, "range", "'1.0.0' is not a range; write GOOD..BAD, e.g. 1.0.0..1.0.9"),
        ({"package": "not a name!"}, "package", "'not a name!' is not a package name"),
        ({"script": "  "}, "script", "the script is empty"),
        ({"script": "x" * (1024 * 1024 + 1)}, "script", "the script is larger than 1 MiB"),
        ({"repeats": 0}, "repeats", "Input should be greater than or equal to 1"),
        ({"min_growth_mib": 0}, "min_growth_mib", "Input should be greater than 0"),
    ],
)
def test_job_create_rejects(fields, loc, message) -> None:
    with pytest.raises(ValidationError) as err:
        request(**fields)
    first = err.value.errors()[0]
    assert first["loc"] == (loc,)
    assert first["msg"].removeprefix("Value error, ") == message
