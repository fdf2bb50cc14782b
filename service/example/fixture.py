"""Synthetic releases of `leakyfixture`, a tiny package that starts leaking at a known release.

`build_fixture(dest)` writes one wheel per release (straight with `zipfile`: no build
backend) plus `index.json`, the per-file metadata a package index would know and a
wheel cannot carry (upload time, yanked, Requires-Python); `service.example.index`
serves the directory as a PEP 503/691 index.

The default `FixtureSpec()`:

| release    | what it is                                                           |
| ---------- | -------------------------------------------------------------------- |
| 1.0.0-1.0.2| clean                                                                |
| 1.0.3      | clean, yanked ("broken metadata")                                    |
| 1.0.4      | clean, but only a `cp311-cp311-win_amd64` wheel: untestable on Linux |
| 1.0.5      | clean: the last good release                                         |
| 1.0.6      | the first leaking release: 1 MiB retained per `step()`               |
| 1.0.7-1.0.9| leaking                                                              |
| 1.1.0rc1   | a pre-release after the last final release; leaking                  |

Upload times are one day apart in version order from 2024-01-01T00:00:00Z (1.0.0),
so 1.0.6 was uploaded 2024-01-07 and 1.1.0rc1 2024-01-11.

Other shapes: `leak_ranges` makes a range that leaks, stops and leaks again (each
leaking stretch given by its first and last release), and `lacks_new_api` gives every
release but the ones named a `new_api()` that a repro may call (one that does cannot run
on those: AttributeError).

Every release's `leakyfixture.step()` also carries bounded noise, so a classifier that
mistakes a spike or a filling cache for a leak fails on the clean releases:

- `spikes`: every `spike_every` steps (at steps 5, 15, 25, ... by default) 32 MiB is
  allocated, touched, held for two steps and freed again;
- `cache`: a cache fills with `cache_kib` over the first `cache_fill_steps` steps, then stops;
- `churn`: a few thousand small objects are allocated and dropped every step.

One more kind is off by default, for the spike workload (`SPIKE_WORKLOAD`: this noise and a
steady 3 MiB kept per step on the leaking releases, run without step markers):

- `page_spikes`: every `page_spike_every` steps (the 10th, 20th, ...) a buffer of
  `page_spike_mib` MiB (200) is mapped, touched page by page from Python and unmapped
  again within the step, so the RSS climbs for as long as the touching takes (longer on a
  loaded machine) and falls at once. Its code is appended to the module only when it is
  asked for, so every other fixture's wheels stay byte for byte as they were.

Leaked memory is real: buffers are filled byte by byte (`bytearray(b"\\xa5") * n` is a
memset), so every page is touched and RSS grows. With the bundled repro (40 steps) a
leaking release grows by about 40 MiB and a clean one stays flat after step 8.
"""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType

from packaging.version import Version

NAME = "leakyfixture"
INDEX_METADATA = "index.json"
PURE_TAG = "py3-none-any"
FOREIGN_TAG = "cp311-cp311-win_amd64"
# Fixed zip timestamps keep the wheels, and so their hashes, reproducible.
_ZIP_DATE = (2024, 1, 1, 0, 0, 0)

DEFAULT_VERSIONS = tuple(f"1.0.{i}" for i in range(10))
NOISE_KINDS = ("spikes", "cache", "churn", "page_spikes")


@dataclass(frozen=True)
class FixtureSpec:
    """What releases to generate; see the module docstring for the defaults."""

    versions: tuple[str, ...] = DEFAULT_VERSIONS
    first_leaking: str = "1.0.6"
    # A release that fixes the leak again (for find-fix); None: it never gets fixed.
    fixed_in: str | None = None
    leak_kib_per_step: int = 1024
    noise: tuple[str, ...] = ("spikes", "cache", "churn")
    prerelease: str | None = "1.1.0rc1"
    # version -> reason; stored read-only (a plain dict passed in is copied).
    yanked: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({"1.0.3": "broken metadata"}),
        hash=False,
    )
    foreign_only: str | None = "1.0.4"
    upload_start: datetime = datetime(2024, 1, 1, tzinfo=UTC)
    requires_python: str | None = ">=3.8"
    spike_mib: int = 32
    spike_every: int = 10
    page_spike_mib: int = 200
    page_spike_every: int = 10
    cache_kib: int = 4096
    cache_fill_steps: int = 8
    # How a leaking release leaks: "python" (a bytearray kept, visible to tracemalloc) or
    # "native" (malloc without free in a tiny C library built with the system's cc and
    # called through ctypes: only memray's native stacks see it).
    leak_via: str = "python"
    # A range that leaks, stops and leaks again: the (first, last) releases of each leaking
    # stretch, inclusive (last None: to the end), instead of first_leaking and fixed_in.
    leak_ranges: tuple[tuple[str, str | None], ...] = ()
    # Releases without `leakyfixture.new_api()` (a repro calling it cannot run on them:
    # AttributeError), every other release has it; None: no release has it.
    lacks_new_api: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "versions", tuple(self.versions))
        object.__setattr__(self, "leak_ranges", tuple(tuple(r) for r in self.leak_ranges))
        if self.lacks_new_api is not None:
            object.__setattr__(self, "lacks_new_api", tuple(self.lacks_new_api))
        object.__setattr__(self, "noise", tuple(self.noise))
        object.__setattr__(self, "yanked", MappingProxyType(dict(self.yanked)))
        if self.leak_via not in ("python", "native"):
            raise ValueError(f"leak_via must be 'python' or 'native', not {self.leak_via!r}")
        unknown = set(self.noise) - set(NOISE_KINDS)
        if unknown:
            raise ValueError(f"unknown noise kinds: {', '.join(sorted(unknown))}")
        if self.upload_start.tzinfo is None:
            raise ValueError("upload_start must be timezone-aware")
        if self.page_spike_mib < 1 or self.page_spike_every < 1:
            raise ValueError("page_spike_mib and page_spike_every must be at least 1")

    def all_versions(self) -> list[str]:
        """Every release the fixture builds, in PEP 440 order."""
        out = list(self.versions)
        if self.prerelease is not None:
            out.append(self.prerelease)
        return sorted(out, key=Version)

    def leaks(self, version: str) -> bool:
        v = Version(version)
        if self.leak_ranges:
            return any(
                Version(first) <= v and (last is None or v <= Version(last))
                for first, last in self.leak_ranges
            )
        fixed = self.fixed_in is not None and v >= Version(self.fixed_in)
        return v >= Version(self.first_leaking) and not fixed

    def upload_time(self, version: str) -> datetime:
        return self.upload_start + timedelta(days=self.all_versions().index(version))

    def wheel_tag(self, version: str) -> str:
        if version == self.foreign_only:
            return FOREIGN_TAG
        return native_tag() if self.leak_via == "native" else PURE_TAG

    def wheel_filename(self, version: str) -> str:
        return f"{NAME}-{Version(version)}-{self.wheel_tag(version)}.whl"


# The spike workload (issue #35): a 200 MiB buffer touched page by page every 10th step, a
# steady 3 MiB a step kept on the leaking releases (1.0.6 on), no other noise. Run it
# without step markers (service.example.paced).
SPIKE_WORKLOAD = FixtureSpec(leak_kib_per_step=3 * 1024, noise=("page_spikes",))


def native_tag() -> str:
    """The tag of a wheel holding a library built here, for this machine only."""
    return f"py3-none-linux_{platform.machine()}"


_MODULE_TEMPLATE = '''\
"""leakyfixture {version}: a synthetic release built by leakbisect's test fixture."""

__version__ = {version!r}
LEAKS = {leaks!r}
LEAK_BYTES = {leak_bytes!r}
NOISE = {noise!r}
SPIKE_BYTES = {spike_bytes!r}
SPIKE_EVERY = {spike_every!r}
SPIKE_HOLD_STEPS = 2
CACHE_BYTES = {cache_bytes!r}
CACHE_FILL_STEPS = {cache_fill_steps!r}
CACHE_ENTRY_BYTES = 64 * 1024

_steps = 0
_retained = []
_cache = {{}}
_spike = None


def _touched(n):
    # A memset: every page is written, so the memory shows up in RSS.
    return bytearray(b"\\xa5") * n


def step():
    """One unit of work: leaks LEAK_BYTES if LEAKS, plus the bounded noise in NOISE."""
    global _steps, _spike
    _steps += 1
    if LEAKS and LEAK_BYTES:
        _retained.append(_touched(LEAK_BYTES))
    if "spikes" in NOISE and SPIKE_EVERY > 0:
        phase = _steps % SPIKE_EVERY
        if phase == SPIKE_EVERY // 2:
            _spike = _touched(SPIKE_BYTES)
        elif phase == (SPIKE_EVERY // 2 + SPIKE_HOLD_STEPS) % SPIKE_EVERY:
            _spike = None
    if "cache" in NOISE and CACHE_BYTES > 0:
        per_step = -(-CACHE_BYTES // max(CACHE_FILL_STEPS, 1))
        target = min(CACHE_BYTES, per_step * _steps)
        while len(_cache) * CACHE_ENTRY_BYTES < target:
            _cache[len(_cache)] = _touched(CACHE_ENTRY_BYTES)
    if "churn" in NOISE:
        junk = [(i, str(i), [i]) for i in range(3000)]
        del junk
'''


_NATIVE_LEAK = "_retained.append(_touched(LEAK_BYTES))"
_NATIVE_TEMPLATE = '''

import ctypes
import os

_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "_leak.so"))
_lib.leak.restype = ctypes.c_void_p
_lib.leak.argtypes = [ctypes.c_size_t]


def _native(n):
    # malloc and a memset in C, never freed: no Python allocator sees it.
    return _lib.leak(n)
'''
NATIVE_C = """\
#include <stdlib.h>
#include <string.h>

void *leak(size_t n) {
    void *p = malloc(n);
    if (p) memset(p, 0xa5, n);
    return p;
}
"""


_PAGE_SPIKES_TEMPLATE = '''

import mmap

PAGE_SPIKE_BYTES = {page_spike_bytes!r}
PAGE_SPIKE_EVERY = {page_spike_every!r}
_step_without_page_spikes = step


def step():
    """step(), and every PAGE_SPIKE_EVERY steps a buffer touched page by page and freed."""
    _step_without_page_spikes()
    if _steps % PAGE_SPIKE_EVERY == 0:
        buffer = mmap.mmap(-1, PAGE_SPIKE_BYTES)  # anonymous: no page of it resident yet
        for offset in range(0, PAGE_SPIKE_BYTES, mmap.PAGESIZE):
            buffer[offset] = 0xA5
        buffer.close()  # unmapped: the RSS falls back at once
'''


_NEW_API_TEMPLATE = '''

def new_api():
    """An API the releases not in the fixture's `lacks_new_api` have."""
    return True
'''


def module_source(spec: FixtureSpec, version: str) -> str:
    """The `leakyfixture/__init__.py` of one release."""
    source = _module_source(spec, version)
    if spec.leak_via == "native":
        source = source.replace(_NATIVE_LEAK, "_native(LEAK_BYTES)") + _NATIVE_TEMPLATE
    if "page_spikes" in spec.noise:
        source += _PAGE_SPIKES_TEMPLATE.format(
            page_spike_bytes=spec.page_spike_mib * 1024 * 1024,
            page_spike_every=spec.page_spike_every,
        )
    if spec.lacks_new_api is not None and version not in spec.lacks_new_api:
        source += _NEW_API_TEMPLATE
    return source


def native_library(workdir: Path) -> bytes:
    """`_leak.so`, built from `NATIVE_C` with the system's C compiler (cc)."""
    c = workdir / "leak.c"
    c.write_text(NATIVE_C)
    out = workdir / "_leak.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-g", "-O1", "-o", str(out), str(c)], check=True)
    return out.read_bytes()


def _module_source(spec: FixtureSpec, version: str) -> str:
    return _MODULE_TEMPLATE.format(
        version=str(Version(version)),
        leaks=spec.leaks(version),
        leak_bytes=spec.leak_kib_per_step * 1024,
        noise=spec.noise,
        spike_bytes=spec.spike_mib * 1024 * 1024,
        spike_every=spec.spike_every,
        cache_bytes=spec.cache_kib * 1024,
        cache_fill_steps=spec.cache_fill_steps,
    )


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def pack_wheel(
    path: Path,
    name: str,
    version: str,
    files: Mapping[str, bytes],
    *,
    tag: str = PURE_TAG,
    summary: str,
    requires_python: str | None = None,
    requires_dist: Sequence[str] = (),
) -> Path:
    """Write a wheel of `files` (archive path -> content) with its METADATA, WHEEL and RECORD.

    `requires_dist`: one `Requires-Dist:` line each (PEP 508 strings, written as given).

    Reproducible: fixed zip timestamps and modes, so the same input gives the same bytes.
    """
    norm = str(Version(version))
    dist_info = f"{name}-{norm}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {norm}", f"Summary: {summary}"]
    if requires_python:
        metadata.append(f"Requires-Python: {requires_python}")
    metadata.extend(f"Requires-Dist: {req}" for req in requires_dist)
    wheel = [
        "Wheel-Version: 1.0",
        "Generator: leakbisect-fixture",
        f"Root-Is-Purelib: {'true' if tag == PURE_TAG else 'false'}",
        f"Tag: {tag}",
    ]
    content = {
        **files,
        f"{dist_info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{dist_info}/WHEEL": ("\n".join(wheel) + "\n").encode(),
    }
    record = [f"{n},{_record_hash(data)},{len(data)}" for n, data in content.items()]
    record.append(f"{dist_info}/RECORD,,")
    content[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for n, data in content.items():
            info = zipfile.ZipInfo(n, date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


def write_wheel(dest: Path, spec: FixtureSpec, version: str, native: bytes = b"") -> Path:
    """Write one release's wheel into `dest` and return its path; `native`: `_leak.so`
    (for `leak_via="native"`)."""
    files = {f"{NAME}/__init__.py": module_source(spec, version).encode()}
    if spec.leak_via == "native":
        files[f"{NAME}/_leak.so"] = native
    return pack_wheel(
        dest / spec.wheel_filename(version),
        NAME,
        version,
        files,
        tag=spec.wheel_tag(version),
        summary="Synthetic releases for leakbisect tests; leaks from a known version on.",
        requires_python=spec.requires_python,
    )


def iso_z(dt: datetime) -> str:
    """An aware datetime as the index writes upload times: ISO 8601 UTC with `Z`."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_fixture(dest: Path, spec: FixtureSpec | None = None) -> Path:
    """Write every release's wheel and `index.json` into `dest`; returns `dest`.

    `index.json` maps each filename to what the index knows about it:
    `{"files": {filename: {"requires_python", "yanked", "upload_time"}}}`, where
    `yanked` is `false` or the reason and `upload_time` is ISO 8601 with `Z`.
    """
    spec = spec or FixtureSpec()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for version in spec.yanked:
        if version not in spec.all_versions():
            raise ValueError(f"yanked version {version} is not one of the fixture's releases")
    meta: dict[str, dict[str, object]] = {}
    native = b""
    if spec.leak_via == "native":
        with tempfile.TemporaryDirectory() as work:
            native = native_library(Path(work))
    for version in spec.all_versions():
        path = write_wheel(dest, spec, version, native)
        meta[path.name] = {
            "requires_python": spec.requires_python,
            "yanked": spec.yanked.get(version, False),
            "upload_time": iso_z(spec.upload_time(version)),
        }
    (dest / INDEX_METADATA).write_text(json.dumps({"files": meta}, indent=2, sort_keys=True))
    return dest
