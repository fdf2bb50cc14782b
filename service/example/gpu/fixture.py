"""Synthetic releases of `gpuleakfixture`, whose version picks the GPU repro's variants.

`build_gpu_fixture(dest)` writes one pure wheel per release plus `index.json` (as
`service.example.fixture` does for the CPU fixture), and `service.example.index.serve_index`
serves the directory as a PEP 503/691 index on 127.0.0.1. A release holds no code, only
data that `service/example/gpu/repro.py` reads when it runs in that release's environment:

- ``VARIANTS``: the repro variants the release runs together each step;
- ``CUDA_LIBRARY``: the driver library to load (None: ``libcuda.so.1``); tests bake the
  FAKE driver's path in, so a trial finds it whatever environment it is given.

The default `GpuFixtureSpec()`:

| release     | VARIANTS                           | judged |
| ----------- | ---------------------------------- | ------ |
| 0.1.0-0.1.4 | device-plateau + pinned-reuse      | clean or plateau: the last good is 0.1.4 |
| 0.1.5-0.1.7 | device-leak + pinned-leak          | leak: the first bad is 0.1.5 |

With one runner a bisection of 0.1.0..0.1.7 runs, in order: 0.1.0, 0.1.7 (the bounds),
0.1.3, 0.1.5, 0.1.4 (binary search), then 0.1.4 and 0.1.5 again (the confirmation).
Upload times are one day apart from 2024-03-01T00:00:00Z.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from packaging.version import Version

from service.example.fixture import INDEX_METADATA, PURE_TAG, iso_z, pack_wheel
from service.example.gpu.repro import VARIANTS

NAME = "gpuleakfixture"
GOOD_VARIANTS = ("device-plateau", "pinned-reuse")
BAD_VARIANTS = ("device-leak", "pinned-leak")
KNOWN_VARIANTS = tuple(VARIANTS)


@dataclass(frozen=True)
class GpuFixtureSpec:
    """Which releases to build and what each runs; see the module docstring for defaults."""

    versions: tuple[str, ...] = tuple(f"0.1.{i}" for i in range(8))
    first_leaking: str = "0.1.5"
    good: tuple[str, ...] = GOOD_VARIANTS
    bad: tuple[str, ...] = BAD_VARIANTS
    cuda_library: str | None = None
    upload_start: datetime = datetime(2024, 3, 1, tzinfo=UTC)
    requires_python: str | None = ">=3.8"

    def __post_init__(self) -> None:
        object.__setattr__(self, "versions", tuple(sorted(self.versions, key=Version)))
        for field_name in ("good", "bad"):
            names = tuple(getattr(self, field_name))
            object.__setattr__(self, field_name, names)
            unknown = [n for n in names if n not in KNOWN_VARIANTS]
            if not names or unknown:
                raise ValueError(
                    f"{field_name}: {unknown[0] if unknown else 'empty'!r} is not a list of "
                    f"variants from {', '.join(KNOWN_VARIANTS)}"
                )
        if self.first_leaking not in self.versions:
            raise ValueError(f"first_leaking: {self.first_leaking} is not one of the versions")

    def leaks(self, version: str) -> bool:
        return Version(version) >= Version(self.first_leaking)

    def variants(self, version: str) -> tuple[str, ...]:
        return self.bad if self.leaks(version) else self.good

    def upload_time(self, version: str) -> datetime:
        return self.upload_start + timedelta(days=self.versions.index(version))

    def wheel_filename(self, version: str) -> str:
        return f"{NAME}-{Version(version)}-{PURE_TAG}.whl"


def module_source(spec: GpuFixtureSpec, version: str) -> str:
    """The `gpuleakfixture/__init__.py` of one release."""
    return (
        f'"""gpuleakfixture {Version(version)}: a synthetic release of leakbisect\'s GPU '
        'fixture (data only; service/example/gpu/repro.py runs it)."""\n\n'
        f"__version__ = {str(Version(version))!r}\n"
        f"VARIANTS = {spec.variants(version)!r}\n"
        f"CUDA_LIBRARY = {spec.cuda_library!r}\n"
    )


def build_gpu_fixture(dest: Path, spec: GpuFixtureSpec | None = None) -> Path:
    """Write every release's wheel and `index.json` into `dest`; returns `dest`."""
    spec = spec or GpuFixtureSpec()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    meta: dict[str, dict[str, object]] = {}
    for version in spec.versions:
        path = pack_wheel(
            dest / spec.wheel_filename(version),
            NAME,
            version,
            {f"{NAME}/__init__.py": module_source(spec, version).encode()},
            summary="Synthetic GPU fixture releases for leakbisect; leaks from a known version.",
            requires_python=spec.requires_python,
        )
        meta[path.name] = {
            "requires_python": spec.requires_python,
            "yanked": False,
            "upload_time": iso_z(spec.upload_time(version)),
        }
    (dest / INDEX_METADATA).write_text(json.dumps({"files": meta}, indent=2, sort_keys=True))
    return dest
