"""A generated good and bad environment of several fixture packages: "which dependency changed".

`build_suite(dest, scenario)` writes, into `dest`:

- one pure-Python wheel (`py3-none-any`, packed with `fixture.pack_wheel`) for every release
  of every suite package, so `dest` is a find-links directory (`uv pip install --no-index
  --find-links dest ...`), plus `index.json` (upload times a day apart in version order per
  package) so `service.example.index` can serve it as an index too;
- `good.txt` and `bad.txt`: the two environments, pip freeze format (`name==version`, sorted);
- `repro.py`: imports every suite package and calls each one's `step()` 40 times, printing
  the step marker after every step (flushed), as `service/example/repro.py` does.

Every package moves between the good and the bad environment and has releases in between
(gamma 1.0.0..1.0.5, ...), so once the culprit is known the release stage can bisect it.

| scenario       | what leaks                                                                   |
| -------------- | ---------------------------------------------------------------------------- |
| `one`          | suite-gamma from 1.0.3 on; every other package changes but stays clean       |
| `interaction`  | only suite-beta >= 2.0.2 together with suite-delta >= 1.1.0: beta hands each  |
|                | step's buffer to `suite_delta.register` when it exists, and only delta       |
|                | >= 1.1.0 has a `register` (it keeps what it is given); neither leaks alone    |
| `unresolvable` | as `one`, but suite-epsilon 2.x has `Requires-Dist: suite-zeta>=2` while the |
|                | good environment has zeta 1.x: a mix of new epsilon and old zeta is invalid  |

A leak is real memory: 1 MiB per `step()` filled byte by byte (a memset, as fixture.py's
`_touched`), kept in the package's `_retained` list (delta's `_registry` for the
interaction). A clean release allocates and touches the same 1 MiB and drops it. No other
noise: the suite is about attribution, not about the classifier.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType

from packaging.version import Version

from service.example.fixture import INDEX_METADATA, PURE_TAG, iso_z, pack_wheel

SCENARIOS = ("one", "interaction", "unresolvable")
STEP_BYTES = 1024 * 1024
STEPS = 40
_UPLOAD_START = datetime(2024, 3, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Suite:
    """What `build_suite` wrote, and the answer a delta-debugging run must find."""

    scenario: str
    find_links: Path
    good: Path  # good.txt
    bad: Path  # bad.txt
    repro: Path  # repro.py
    # The packages whose change is needed for the leak, sorted.
    culprits: tuple[str, ...]
    # culprit -> its first leaking release (with the others at their bad versions).
    first_bad: Mapping[str, str] = field(hash=False)


@dataclass(frozen=True)
class _Package:
    name: str
    versions: tuple[str, ...]  # every release, in version order
    good: str
    bad: str
    # Leaks by itself from this release on; None: never by itself.
    leaks_from: str | None = None
    # Hands each step's buffer to suite_delta.register from this release on (beta).
    registers_from: str | None = None
    # Has `register()`, which keeps what it is given, from this release on (delta).
    registry_from: str | None = None
    # version prefix -> Requires-Dist lines for the releases that start with it.
    requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)


def _releases(prefix: str, last: int) -> tuple[str, ...]:
    return tuple(f"{prefix}.{i}" for i in range(last + 1))


def _plan(scenario: str) -> list[_Package]:
    """The packages of a scenario; the same six names and ranges, the behaviour differs."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    gamma_leaks = "1.0.3" if scenario in ("one", "unresolvable") else None
    interaction = scenario == "interaction"
    delta = ("1.0.0", "1.0.1", "1.0.2", "1.1.0", "1.1.1")
    if scenario == "unresolvable":
        epsilon = _Package(
            "suite-epsilon",
            ("1.4.0", "1.4.1", "2.0.0", "2.0.1", "2.1.0"),
            "1.4.0",
            "2.1.0",
            requires={"2.": ("suite-zeta>=2",)},
        )
        zeta = _Package("suite-zeta", ("1.2.0", "1.3.0", "2.0.0", "2.0.1"), "1.3.0", "2.0.1")
    else:
        epsilon = _Package("suite-epsilon", _releases("1.0", 3), "1.0.0", "1.0.3")
        zeta = _Package("suite-zeta", _releases("3.1", 2), "3.1.0", "3.1.2")
    return [
        _Package("suite-alpha", _releases("0.4", 3), "0.4.0", "0.4.3"),
        _Package(
            "suite-beta",
            _releases("2.0", 4),
            "2.0.0",
            "2.0.4",
            registers_from="2.0.2" if interaction else None,
        ),
        _Package("suite-gamma", _releases("1.0", 5), "1.0.0", "1.0.5", leaks_from=gamma_leaks),
        _Package(
            "suite-delta", delta, "1.0.0", "1.1.1", registry_from="1.1.0" if interaction else None
        ),
        epsilon,
        zeta,
    ]


def _from(version: str, first: str | None) -> bool:
    return first is not None and Version(version) >= Version(first)


_MODULE_TEMPLATE = '''\
"""{name} {version}: a synthetic release of leakbisect's suite fixture ({scenario})."""

__version__ = {version!r}
LEAKS = {leaks!r}
REGISTERS = {registers!r}
STEP_BYTES = {step_bytes!r}

_steps = 0
_retained = []


def _touched(n):
    # A memset: every page is written, so the memory shows up in RSS.
    return bytearray(b"\\xa5") * n


def step():
    """One unit of work: STEP_BYTES allocated and touched; kept only if LEAKS."""
    global _steps
    _steps += 1
    buf = _touched(STEP_BYTES)
    if LEAKS:
        _retained.append(buf)
    if REGISTERS:
        # Hand the buffer to delta's registry, which only newer deltas have.
        try:
            import suite_delta
        except ImportError:
            suite_delta = None
        if hasattr(suite_delta, "register"):
            suite_delta.register(buf)
    del buf
'''

_REGISTRY = '''

_registry = []


def register(obj):
    """Keep `obj` for later (forever: the interaction's leak)."""
    _registry.append(obj)
'''


def _module(pkg: _Package, version: str, scenario: str) -> str:
    text = _MODULE_TEMPLATE.format(
        name=pkg.name,
        version=version,
        scenario=scenario,
        leaks=_from(version, pkg.leaks_from),
        registers=_from(version, pkg.registers_from),
        step_bytes=STEP_BYTES,
    )
    return text + _REGISTRY if _from(version, pkg.registry_from) else text


def _requires(pkg: _Package, version: str) -> tuple[str, ...]:
    return next((r for p, r in pkg.requires.items() if version.startswith(p)), ())


_REPRO_TEMPLATE = '''\
"""The suite's repro ({scenario}): {steps} steps of every suite package's `step()`.

Prints the step marker `::leakbisect-step::` after every step (flushed) and pauses a
little, so that a 10 Hz sampler sees the curve (about 2 s in all); honours
`LEAKBISECT_STEPS` as service/example/repro.py does.
"""

import os
import sys
import time

{imports}

PACKAGES = ({modules},)
STEPS = {steps}
STEP_MARKER = "::leakbisect-step::"


def main(steps=STEPS):
    for _ in range(steps):
        for module in PACKAGES:
            module.step()
        print(STEP_MARKER, flush=True)
        time.sleep(0.05)
    return 0


def steps_from_env(default=STEPS):
    text = os.environ.get("LEAKBISECT_STEPS", "")
    return int(text) if text.isdigit() and int(text) > 0 else default


if __name__ == "__main__":
    sys.exit(main(steps_from_env()))
'''


def import_name(name: str) -> str:
    """`suite-gamma` -> `suite_gamma`, the module a suite package installs."""
    return name.replace("-", "_")


def _repro(packages: list[_Package], scenario: str) -> str:
    modules = [import_name(p.name) for p in packages]
    return _REPRO_TEMPLATE.format(
        scenario=scenario,
        steps=STEPS,
        imports="\n".join(f"import {m}" for m in modules),
        modules=", ".join(modules),
    )


def _freeze(packages: list[_Package], which: str) -> str:
    return "".join(
        f"{p.name}=={getattr(p, which)}\n" for p in sorted(packages, key=lambda p: p.name)
    )


def build_suite(dest: Path, scenario: str) -> Suite:
    """Write the scenario's wheels, index.json, good.txt, bad.txt and repro.py into `dest`."""
    packages = _plan(scenario)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    meta: dict[str, dict[str, object]] = {}
    for pkg in packages:
        for day, version in enumerate(pkg.versions):
            module = import_name(pkg.name)
            path = pack_wheel(
                dest / f"{module}-{Version(version)}-{PURE_TAG}.whl",
                # The escaped name: pack_wheel names the .dist-info directory after it.
                module,
                version,
                {f"{module}/__init__.py": _module(pkg, version, scenario).encode()},
                summary=f"leakbisect suite fixture ({scenario})",
                requires_dist=_requires(pkg, version),
            )
            upload = _UPLOAD_START + timedelta(days=day)
            meta[path.name] = {
                "requires_python": None,
                "yanked": False,
                "upload_time": iso_z(upload),
            }
    (dest / INDEX_METADATA).write_text(json.dumps({"files": meta}, indent=2, sort_keys=True))
    good, bad, repro = dest / "good.txt", dest / "bad.txt", dest / "repro.py"
    good.write_text(_freeze(packages, "good"))
    bad.write_text(_freeze(packages, "bad"))
    repro.write_text(_repro(packages, scenario))
    first_bad = {
        p.name: first
        for p in packages
        for first in (p.leaks_from or p.registers_from or p.registry_from,)
        if first is not None
    }
    return Suite(
        scenario=scenario,
        find_links=dest,
        good=good,
        bad=bad,
        repro=repro,
        culprits=tuple(sorted(first_bad)),
        first_bad=MappingProxyType(first_bad),
    )
