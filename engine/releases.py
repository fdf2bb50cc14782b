"""Releases of a package and the range to bisect. Pure: no I/O.

`service.index.list_releases` fills `Release` objects from package indexes; this module
orders them (PEP 440: epochs, pre-, post- and dev-releases), decides whether a release
can be installed on the target, and cuts the range `GOOD..BAD` out of them.

Rules of `select_range`:
- both ends are included and must exist; the range is written OLD..NEW (in find-fix
  mode the planner inverts polarity, the order of versions stays the same);
- pre-releases (including dev releases) strictly inside the range are left out unless
  `pre=True`; a pre-release named as an end is always kept;
- yanked releases inside the range are kept and flagged (with their reason) unless
  `skip_yanked=True`; a yanked release named as an end is always kept.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from contract.errors import InvalidInput


class RangeError(InvalidInput):
    """A range that cannot be bisected; the message is one line, meant for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="range")


@dataclass(frozen=True)
class DistFile:
    """One distribution file of a release, as an index lists it."""

    filename: str
    url: str
    requires_python: str | None = None
    # None: not yanked; a string: yanked, with that reason ("" when none was given).
    yanked: str | None = None
    upload_time: datetime | None = None
    sha256: str | None = None

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")


@dataclass
class Release:
    version: Version
    files: list[DistFile] = field(default_factory=list)

    @property
    def yanked(self) -> bool:
        """PEP 592: a release is yanked when every one of its files is."""
        return bool(self.files) and all(f.yanked is not None for f in self.files)

    @property
    def yanked_reason(self) -> str | None:
        """The reason given for yanking; None when not yanked or no reason was given."""
        if not self.yanked:
            return None
        return next((f.yanked for f in self.files if f.yanked), None)

    @property
    def upload_time(self) -> datetime | None:
        """The earliest upload time among the files (None when the index gave none)."""
        times = [f.upload_time for f in self.files if f.upload_time is not None]
        return min(times) if times else None


@dataclass(frozen=True)
class RangeRelease:
    """One release of the selected range, in order (stored as a `models.Candidate`)."""

    version: str
    release: Release
    yanked: bool
    yanked_reason: str | None
    upload_time: datetime | None
    testable: bool = True
    untestable_reason: str | None = None


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise RangeError(f"'{text}' is not a valid version (PEP 440)") from None


def _tag_strings(tags: Iterable[Tag | str]) -> set[str]:
    return {str(t) for t in tags}


def _python_allowed(requires_python: str | None, python: Version) -> bool:
    if not requires_python:
        return True
    try:
        spec = SpecifierSet(requires_python)
    except InvalidSpecifier:
        return True  # as installers do: an unreadable Requires-Python does not exclude
    return spec.contains(python, prereleases=True)


def installability(
    release: Release, python_version: str, platform_tags: Iterable[Tag | str]
) -> tuple[bool, str | None]:
    """Whether some file of `release` installs on the target; `(False, why)` when none does.

    A wheel counts when one of its tags is supported and Requires-Python allows the
    target; an sdist counts when Requires-Python allows it (it may still fail to build).
    Yanked files are ignored unless the whole release is yanked (pinning installs it).
    """
    python = Version(python_version)
    supported = _tag_strings(platform_tags)
    files = release.files if release.yanked else [f for f in release.files if f.yanked is None]
    if not files:
        return False, "no distribution files"
    allowed = [f for f in files if _python_allowed(f.requires_python, python)]
    if not allowed:
        specs = sorted({f.requires_python for f in files if f.requires_python})
        return False, f"requires Python {' or '.join(specs)}; the target is {python_version}"
    wheel_tags: set[str] = set()
    for f in allowed:
        if f.is_wheel:
            try:
                _name, _ver, _build, tags = parse_wheel_filename(f.filename)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            file_tags = _tag_strings(tags)
            if file_tags & supported:
                return True, None
            wheel_tags |= file_tags
        else:
            try:
                parse_sdist_filename(f.filename)
            except (InvalidSdistFilename, InvalidVersion):
                continue
            return True, None
    if not wheel_tags:
        return False, "no wheel or sdist that an installer can use"
    return False, (
        f"no wheel for Python {python_version} on this platform and no sdist"
        f" (wheels: {', '.join(sorted(wheel_tags))})"
    )


def sort_releases(releases: Iterable[Release]) -> list[Release]:
    return sorted(releases, key=lambda r: r.version)


def _nearest(versions: Sequence[Version], wanted: Version) -> list[Version]:
    """The two known versions around where `wanted` would be (the two at an edge)."""
    i = bisect.bisect_left(versions, wanted)
    start = min(max(i - 1, 0), max(len(versions) - 2, 0))
    return list(versions[start : start + 2])


def select_range(
    releases: Iterable[Release],
    good: str,
    bad: str,
    *,
    pre: bool = False,
    skip_yanked: bool = False,
    package: str | None = None,
    python_version: str | None = None,
    platform_tags: Iterable[Tag | str] | None = None,
) -> list[RangeRelease]:
    """The releases from `good` to `bad` (both included) in PEP 440 order.

    `package` names the package in error messages. With `python_version` and
    `platform_tags`, each candidate's testability is filled in (`installability`);
    without them every candidate counts as testable.
    """
    ordered = sort_releases(releases)
    what = f" of {package}" if package else ""
    if not ordered:
        raise RangeError(f"{package or 'the package'} has no releases")
    good_v, bad_v = parse_version(good), parse_version(bad)
    visible = [r.version for r in ordered if pre or not r.version.is_prerelease]
    by_version = {r.version: r for r in ordered}
    for text, v in ((good, good_v), (bad, bad_v)):
        if v not in by_version:
            near = ", ".join(str(n) for n in _nearest(visible or [r.version for r in ordered], v))
            raise RangeError(f"version {text}{what} does not exist; nearest: {near}")
    if good_v > bad_v:
        raise RangeError(f"range is reversed: {good} is newer than {bad}; write OLD..NEW")

    chosen: list[Release] = []
    for r in ordered:
        if not good_v <= r.version <= bad_v:
            continue
        is_end = r.version in (good_v, bad_v)
        if not is_end and r.version.is_prerelease and not pre:
            continue
        if not is_end and skip_yanked and r.yanked:
            continue
        chosen.append(r)
    if len(chosen) < 2:
        n = len(chosen)
        raise RangeError(
            f"range {good}..{bad} holds only {n} release{'s' if n != 1 else ''};"
            " a bisection needs at least 2"
        )

    tags = list(platform_tags) if platform_tags is not None else None
    out = []
    for r in chosen:
        testable, why = True, None
        if python_version is not None and tags is not None:
            testable, why = installability(r, python_version, tags)
        out.append(
            RangeRelease(
                version=str(r.version),
                release=r,
                yanked=r.yanked,
                yanked_reason=r.yanked_reason,
                upload_time=r.upload_time,
                testable=testable,
                untestable_reason=why,
            )
        )
    return out
