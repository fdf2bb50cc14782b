"""Synthetic releases of two packages shaped like real ML packages: a heavy import first.

The bundled fixture (`service.example.fixture`) imports in milliseconds; real packages
do not. These two import numpy and scipy and then allocate and write a few hundred MiB
over seconds before the repro's first step marker (a backend, an allocator pool,
kernels), which is what made early stopping call a clean good bound a leak (issue #23).
Each has a known first leaking release. `build_realistic(dest, spec)` writes one wheel
per release (packed with `fixture.pack_wheel`, `Requires-Dist: numpy, scipy`) plus
`index.json`; bisect it with `--find-links dest` beside uv's default index, which
supplies numpy and scipy:

| package        | shaped like           | releases          | first leaking | leak per step     |
| -------------- | --------------------- | ----------------- | ------------- | ----------------- |
| `heavyfixture` | a model library       | 2.0.0 .. 2.0.4    | 2.0.3         | a numpy buffer    |
| `ckptfixture`  | a checkpoint library  | 0.11.8 .. 0.11.12 | 0.11.9        | malloc, no free   |

Both, in every release: on import, numpy and scipy (linalg, sparse, stats), then
`setup_mib` MiB allocated and written in 8 MiB pieces over `setup_s` seconds.

- `heavyfixture.Model().step()`: a matrix product (temporaries), a kernel cache of
  8 x 512 KiB filled over the first 8 steps, a 32 MiB buffer held for one step in ten
  (a checkpoint spike); a leaking release also keeps a 1.5 MiB numpy buffer per step.
- `ckptfixture.CheckpointManager(dir).save(step, tree)`: serialises the tree with
  `np.savez` on a thread pool the manager starts (async checkpointing), writes it to a
  file and keeps the newest two; a leaking release also mallocs 1.5 MiB of "metadata"
  through ctypes per save and never frees it (native: no Python allocator sees it).

The repro scripts are `model_repro.py` and `ckpt_repro.py` beside this file (`REPROS`):
30 steps, a step marker each, `LEAKBISECT_STEPS` honoured as in the bundled repro. A
leaking release grows by about 40 MiB over the judged steps, against a threshold of
about 16 MiB (5 % of the 320 MiB the import leaves).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from packaging.version import Version

from service.example.fixture import INDEX_METADATA, PURE_TAG, iso_z, pack_wheel

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class HeavySpec:
    """One realistic package's releases; see the module docstring for the two defaults."""

    name: str
    kind: str  # "model" or "checkpoint": which module template
    versions: tuple[str, ...]
    first_leaking: str
    setup_mib: int = 200
    setup_s: float = 1.0
    leak_kib_per_step: int = 1536
    upload_start: datetime = datetime(2024, 6, 1, tzinfo=UTC)

    def __post_init__(self) -> None:
        if self.kind not in _TEMPLATES:
            raise ValueError(f"kind must be one of {', '.join(_TEMPLATES)}, not {self.kind!r}")
        if self.first_leaking not in self.versions:
            raise ValueError(f"first_leaking {self.first_leaking} is not one of the versions")

    def leaks(self, version: str) -> bool:
        return Version(version) >= Version(self.first_leaking)

    def last_good(self) -> str:
        return self.versions[self.versions.index(self.first_leaking) - 1]

    def span(self) -> str:
        """The whole range, GOOD..BAD, as `--range` takes it."""
        return f"{self.versions[0]}..{self.versions[-1]}"


_SETUP = '''\
"""{name} {version}: a synthetic {kind} library built by leakbisect's examples."""

import time

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.stats

__version__ = {version!r}
LEAKS = {leaks!r}
LEAK_BYTES = {leak_bytes!r}
SETUP_BYTES = {setup_bytes!r}
SETUP_S = {setup_s!r}


def _start_runtime():
    # What importing a framework does (backends, allocator pools, kernels), written so
    # it is resident: it all happens before the repro's first step marker.
    chunk = 8 << 20
    pieces = max(1, SETUP_BYTES // chunk)
    pool = []
    for _ in range(pieces):
        pool.append(np.ones(chunk // 8))
        time.sleep(SETUP_S / pieces)
    return pool


_runtime = _start_runtime()
'''

_MODEL = """

class Model:
    def __init__(self, seed=0):
        self.w = np.random.default_rng(seed).standard_normal((512, 512))
        self.steps = 0
        self._kernels = {}
        self._spike = None
        self._history = []

    def step(self):
        self.steps += 1
        out = np.tanh(self.w @ self.w[:, :64])  # temporaries, freed
        k = self.steps % 8
        if k not in self._kernels:  # a cache that fills over the first 8 steps
            self._kernels[k] = np.ones(512 * 1024 // 8)
        if self.steps % 10 == 5:  # a checkpoint-like spike, held one step
            self._spike = np.ones((32 << 20) // 8)
        elif self.steps % 10 == 6:
            self._spike = None
        if LEAKS:
            self._history.append(np.ones(LEAK_BYTES // 8))  # kept: the leak
        return float(out[0, 0])
"""

_CHECKPOINT = """
import ctypes
import io
import os
from concurrent.futures import ThreadPoolExecutor

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


class CheckpointManager:
    def __init__(self, directory, max_to_keep=2):
        self.directory = directory
        self.max_to_keep = max_to_keep
        self._pool = ThreadPoolExecutor(max_workers=2)  # async checkpointing
        self._saved = []

    def save(self, step, tree):
        path = self._pool.submit(self._write, step, tree).result()
        self._saved.append(path)
        while len(self._saved) > self.max_to_keep:
            os.remove(self._saved.pop(0))

    def _write(self, step, tree):
        buf = io.BytesIO()
        np.savez(buf, **tree)  # a serialised copy of the tree: a spike, freed
        path = os.path.join(self.directory, f"ckpt_{step}.npz")
        with open(path, "wb") as f:
            f.write(buf.getbuffer())
        if LEAKS:  # "metadata" malloc'd in C, written, never freed: the leak
            _libc.memset(_libc.malloc(LEAK_BYTES), 0x5A, LEAK_BYTES)
        return path
"""

_TEMPLATES = {"model": _MODEL, "checkpoint": _CHECKPOINT}

HEAVY_MODEL = HeavySpec(
    name="heavyfixture", kind="model",
    versions=tuple(f"2.0.{i}" for i in range(5)), first_leaking="2.0.3",
)  # fmt: skip
HEAVY_CHECKPOINT = HeavySpec(
    name="ckptfixture", kind="checkpoint",
    versions=tuple(f"0.11.{i}" for i in range(8, 13)), first_leaking="0.11.9",
)  # fmt: skip
SPECS = {s.name: s for s in (HEAVY_MODEL, HEAVY_CHECKPOINT)}
REPROS = {"heavyfixture": HERE / "model_repro.py", "ckptfixture": HERE / "ckpt_repro.py"}


def module_source(spec: HeavySpec, version: str) -> str:
    """The package's `__init__.py` in one release."""
    head = _SETUP.format(
        name=spec.name, kind=spec.kind, version=str(Version(version)), leaks=spec.leaks(version),
        leak_bytes=spec.leak_kib_per_step * 1024, setup_bytes=spec.setup_mib << 20,
        setup_s=spec.setup_s,
    )  # fmt: skip
    return head + _TEMPLATES[spec.kind]


def build_realistic(dest: Path, spec: HeavySpec) -> Path:
    """Write every release's wheel and `index.json` (upload times a day apart) into `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    meta: dict[str, dict[str, object]] = {}
    for day, version in enumerate(spec.versions):
        wheel = pack_wheel(
            dest / f"{spec.name}-{Version(version)}-{PURE_TAG}.whl",
            spec.name,
            version,
            {f"{spec.name}/__init__.py": module_source(spec, version).encode()},
            summary="Synthetic releases for leakbisect: a heavy import, then a known leak.",
            requires_python=">=3.9",
            requires_dist=("numpy>=1.26", "scipy>=1.11"),
        )
        upload = spec.upload_start + timedelta(days=day)
        meta[wheel.name] = {"requires_python": ">=3.9", "yanked": False,
                            "upload_time": iso_z(upload)}  # fmt: skip
    (dest / INDEX_METADATA).write_text(json.dumps({"files": meta}, indent=2, sort_keys=True))
    return dest
