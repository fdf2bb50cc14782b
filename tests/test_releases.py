"""engine.releases: ordering, range selection, installability. Pure, no I/O."""

import random
from datetime import UTC, datetime

import pytest
from packaging.version import Version

from engine.releases import (
    DistFile,
    RangeError,
    RangeRelease,
    Release,
    installability,
    select_range,
    sort_releases,
)

LINUX_311 = [
    "cp311-cp311-manylinux_2_17_x86_64",
    "cp311-abi3-manylinux_2_17_x86_64",
    "cp311-none-manylinux_2_17_x86_64",
    "py311-none-any",
    "py3-none-any",
]


def wheel(version: str, tag: str = "py3-none-any", **kw) -> DistFile:
    name = f"demo-{version}-{tag}.whl"
    return DistFile(filename=name, url=f"https://files.example/{name}", **kw)


def sdist(version: str, **kw) -> DistFile:
    name = f"demo-{version}.tar.gz"
    return DistFile(filename=name, url=f"https://files.example/{name}", **kw)


def rel(version: str, *files: DistFile) -> Release:
    return Release(Version(version), list(files) or [wheel(version)])


def versions(cands: list[RangeRelease]) -> list[str]:
    return [c.version for c in cands]


MIXED = ["1.0.dev0", "1.0rc1", "1.0", "1.0.post1.dev0", "1.0.post1", "1.0.1", "2.0", "1!0.1"]


@pytest.fixture
def mixed() -> list[Release]:
    releases = [rel(v) for v in MIXED]
    random.Random(4).shuffle(releases)
    return releases


# --- ordering ------------------------------------------------------------------------------


def test_pep440_order_with_dev_post_and_epochs(mixed):
    assert [str(r.version) for r in sort_releases(mixed)] == MIXED
    # An epoch beats any release number: 1!0.1 is newer than 2.0.
    assert Version("1!0.1") > Version("2.0")


def test_prereleases_excluded_by_default(mixed):
    assert versions(select_range(mixed, "1.0", "1!0.1", pre=False, skip_yanked=False)) == [
        "1.0",
        "1.0.post1",
        "1.0.1",
        "2.0",
        "1!0.1",
    ]


def test_prereleases_included_with_pre(mixed):
    assert versions(select_range(mixed, "1.0.dev0", "2.0", pre=True, skip_yanked=False)) == [
        "1.0.dev0",
        "1.0rc1",
        "1.0",
        "1.0.post1.dev0",
        "1.0.post1",
        "1.0.1",
        "2.0",
    ]


def test_named_prerelease_end_is_kept_without_pre(mixed):
    assert versions(select_range(mixed, "1.0rc1", "1.0.1", pre=False, skip_yanked=False)) == [
        "1.0rc1",
        "1.0",
        "1.0.post1",
        "1.0.1",
    ]
    assert versions(select_range(mixed, "1.0", "1.0.post1.dev0", pre=False, skip_yanked=False)) == [
        "1.0",
        "1.0.post1.dev0",
    ]


def test_ends_match_by_pep440_equality():
    releases = [rel("1.0.0"), rel("1.1"), rel("2.0.0")]
    assert versions(select_range(releases, "1.0", "2", pre=False, skip_yanked=False)) == [
        "1.0.0",
        "1.1",
        "2.0.0",
    ]


# --- yanked --------------------------------------------------------------------------------


@pytest.fixture
def with_yanked() -> list[Release]:
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    return [
        rel("1.0.0", wheel("1.0.0", upload_time=t0)),
        rel("1.0.1", wheel("1.0.1", yanked="broken metadata")),
        rel("1.0.2", wheel("1.0.2", yanked="")),  # yanked, no reason given
        # Only one of two files yanked: the release is not yanked (PEP 592).
        rel("1.0.3", wheel("1.0.3", yanked="bad wheel"), sdist("1.0.3")),
        rel("1.0.4", wheel("1.0.4", yanked="oops")),
    ]


def test_yanked_kept_and_flagged(with_yanked):
    cands = select_range(with_yanked, "1.0.0", "1.0.3", pre=False, skip_yanked=False)
    assert [(c.version, c.yanked, c.yanked_reason) for c in cands] == [
        ("1.0.0", False, None),
        ("1.0.1", True, "broken metadata"),
        ("1.0.2", True, None),
        ("1.0.3", False, None),
    ]


def test_yanked_dropped_but_named_ends_kept(with_yanked):
    cands = select_range(with_yanked, "1.0.0", "1.0.4", pre=False, skip_yanked=True)
    assert [(c.version, c.yanked) for c in cands] == [
        ("1.0.0", False),
        ("1.0.3", False),
        ("1.0.4", True),
    ]


def test_upload_time_is_earliest_file():
    early, late = datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 3, tzinfo=UTC)
    r = rel("1.0", wheel("1.0", upload_time=late), sdist("1.0", upload_time=early))
    assert r.upload_time == early
    assert rel("1.0", wheel("1.0")).upload_time is None


# --- installability ------------------------------------------------------------------------


def test_installable_pure_wheel():
    assert installability(rel("1.0"), "3.11", LINUX_311) == (True, None)


def test_foreign_wheel_only_is_untestable():
    r = rel("1.0.4", wheel("1.0.4", "cp311-cp311-win_amd64"), wheel("1.0.4", "cp312-cp312-win32"))
    assert installability(r, "3.11", LINUX_311) == (
        False,
        "no wheel for Python 3.11 on this platform and no sdist"
        " (wheels: cp311-cp311-win_amd64, cp312-cp312-win32)",
    )


def test_platform_wheel_matches_tag():
    r = rel("1.0", wheel("1.0", "cp311-cp311-manylinux_2_17_x86_64"))
    assert installability(r, "3.11", LINUX_311) == (True, None)


def test_requires_python_excluding_target():
    r = rel("2.0", wheel("2.0", requires_python=">=3.12"), sdist("2.0", requires_python=">=3.12"))
    assert installability(r, "3.11", LINUX_311) == (
        False,
        "requires Python >=3.12; the target is 3.11",
    )
    assert installability(r, "3.12", ["py3-none-any"]) == (True, None)


def test_sdist_only_is_installable_when_python_allows():
    assert installability(rel("1.0", sdist("1.0")), "3.11", LINUX_311) == (True, None)
    r = rel("1.0", sdist("1.0", requires_python="<3"))
    assert installability(r, "3.11", LINUX_311) == (False, "requires Python <3; the target is 3.11")


def test_yanked_file_ignored_unless_release_yanked():
    mixed = rel("1.0", wheel("1.0", yanked="bad"), wheel("1.0", "cp311-cp311-win_amd64"))
    assert installability(mixed, "3.11", LINUX_311)[0] is False
    fully = rel("1.0", wheel("1.0", yanked="bad"))
    assert installability(fully, "3.11", LINUX_311) == (True, None)


def test_no_files():
    assert installability(Release(Version("1.0")), "3.11", LINUX_311) == (
        False,
        "no distribution files",
    )


def test_select_range_fills_testability():
    releases = [
        rel("1.0.3"),
        rel("1.0.4", wheel("1.0.4", "cp311-cp311-win_amd64")),
        rel("1.0.5", sdist("1.0.5", requires_python=">=3.12")),
        rel("1.0.6"),
    ]
    cands = select_range(
        releases,
        "1.0.3",
        "1.0.6",
        pre=False,
        skip_yanked=False,
        python_version="3.11",
        platform_tags=LINUX_311,
    )
    assert [(c.version, c.testable, c.untestable_reason) for c in cands] == [
        ("1.0.3", True, None),
        (
            "1.0.4",
            False,
            "no wheel for Python 3.11 on this platform and no sdist"
            " (wheels: cp311-cp311-win_amd64)",
        ),
        ("1.0.5", False, "requires Python >=3.12; the target is 3.11"),
        ("1.0.6", True, None),
    ]
    # Without a target every candidate counts as testable.
    assert all(
        c.testable for c in select_range(releases, "1.0.3", "1.0.6", pre=False, skip_yanked=False)
    )


# --- errors --------------------------------------------------------------------------------


@pytest.fixture
def orbax() -> list[Release]:
    return [rel(f"0.11.{i}") for i in range(8, 20)] + [rel("0.12.0rc1")]


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        (
            "0.11.8",
            "0.11.99",
            "version 0.11.99 of orbax-checkpoint does not exist; nearest: 0.11.18, 0.11.19",
        ),
        (
            "0.11.7",
            "0.11.19",
            "version 0.11.7 of orbax-checkpoint does not exist; nearest: 0.11.8, 0.11.9",
        ),
        (
            "0.11.8",
            "0.11.12.5",
            "version 0.11.12.5 of orbax-checkpoint does not exist; nearest: 0.11.12, 0.11.13",
        ),
        ("0.11.12", "0.11.9", "range is reversed: 0.11.12 is newer than 0.11.9; write OLD..NEW"),
        (
            "0.11.9",
            "0.11.9",
            "range 0.11.9..0.11.9 holds only 1 release; a bisection needs at least 2",
        ),
        (
            "0.11.9",
            "0.11.9.0",
            "range 0.11.9..0.11.9.0 holds only 1 release; a bisection needs at least 2",
        ),
        ("0.11.8", "latest", "'latest' is not a valid version (PEP 440)"),
    ],
)
def test_range_errors(orbax, good, bad, message):
    with pytest.raises(RangeError) as err:
        select_range(orbax, good, bad, pre=False, skip_yanked=False, package="orbax-checkpoint")
    assert str(err.value) == message


def test_nearest_ignores_prereleases_unless_pre(orbax):
    with pytest.raises(RangeError) as err:
        select_range(orbax, "0.11.8", "0.13", pre=True, skip_yanked=False, package="orbax")
    assert str(err.value) == "version 0.13 of orbax does not exist; nearest: 0.11.19, 0.12.0rc1"


def test_error_without_package_name(orbax):
    with pytest.raises(RangeError) as err:
        select_range(orbax, "0.11.8", "0.11.99", pre=False, skip_yanked=False)
    assert str(err.value) == "version 0.11.99 does not exist; nearest: 0.11.18, 0.11.19"


def test_no_releases():
    with pytest.raises(RangeError) as err:
        select_range([], "1.0", "2.0", pre=False, skip_yanked=False, package="nopkg")
    assert str(err.value) == "nopkg has no releases"
