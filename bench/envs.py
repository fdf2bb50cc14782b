"""3. Environment build time per candidate: uv (warm, cold) against `python -m venv` + pip.

For each candidate, in this order, each into a fresh directory:

- uv, cold: `runners.envs.build_env` with an empty uv cache (downloads everything);
- uv, warm shared cache: `build_env` again into a new root, sharing the cache the cold
  build filled (what every candidate after the first gets on a runner: the packages
  they share are not downloaded; they are hard-linked from the cache as a user, copied
  as root, where a published environment must share no inode with the build user's
  cache: `runners.publish`);
- uv, reused: `build_env` on the same root again (same spec hash: nothing to do);
- pip, cold: `python -m venv` + `pip install` with an empty pip cache (a shell loop);
- pip, warm cache: the same with the pip cache the cold pip build filled.

`build_env`'s time includes everything a runner does per candidate: finding the
Python, `uv venv`, `uv pip install`, `uv pip freeze` for the record, and publishing
(taking the tree over, its digest and fingerprint, the rename); a reuse checks the
fingerprint (one ``lstat`` per file).

Sets: the fixture's `leakyfixture` from the local index (served on 127.0.0.1), and in
a full run `scipy` + `numpy` from PyPI (two scipy releases as the candidates).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import Config, clean_env, ratio, reachable_tmpdir, secs, stopwatch, table
from contract.wire import EnvSpec
from runners.envs import build_env
from service.example.fixture import build_fixture
from service.example.index import serve_index

PYPI = "https://pypi.org/simple"
FIXTURE_VERSIONS = ("1.0.0", "1.0.1", "1.0.2", "1.0.5", "1.0.6")
PYPI_CANDIDATES = (("scipy", "1.13.1", ["numpy==1.26.4"]), ("scipy", "1.14.1", ["numpy==1.26.4"]))
ARMS = (
    "uv, cold cache",
    "uv, warm shared cache",
    "uv, environment reused",
    "python -m venv + pip, cold cache",
    "python -m venv + pip, warm cache",
)


def _uv(spec: EnvSpec, root: Path, cache: Path) -> float:
    with stopwatch() as w:
        res = build_env(spec, root=root, cache_dir=cache)
    if not res.ok:
        raise RuntimeError(f"uv build of {spec.package}=={spec.version} failed: {res.error}")
    return w["s"]


def _pip(spec: EnvSpec, venv: Path, pip_cache: Path) -> float:
    env = clean_env(PIP_CACHE_DIR=str(pip_cache))
    reqs = [f"{spec.package}=={spec.version}", *spec.requirements]
    with stopwatch() as w:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
        proc = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
             "--index-url", spec.index_url or PYPI, *reqs],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {reqs} failed: {proc.stderr.strip()[-500:]}")
    return w["s"]


def measure(specs: list[EnvSpec], work: Path) -> dict[str, list[float]]:
    """Seconds per arm, one entry per candidate spec."""
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for k, spec in enumerate(specs):
        base = work / f"c{k}"
        cache, pip_cache = base / "uv-cache", base / "pip-cache"
        times[ARMS[0]].append(_uv(spec, base / "root-cold", cache))
        times[ARMS[1]].append(_uv(spec, base / "root-warm", cache))
        times[ARMS[2]].append(_uv(spec, base / "root-warm", cache))
        times[ARMS[3]].append(_pip(spec, base / "pip-cold", pip_cache))
        times[ARMS[4]].append(_pip(spec, base / "pip-warm", pip_cache))
        shutil.rmtree(base, ignore_errors=True)
    return times


def _rows(label: str, times: dict[str, list[float]]) -> list[list[str]]:
    pip_cold = statistics.median(times[ARMS[3]])
    rows = []
    for arm in ARMS:
        xs = times[arm]
        med = statistics.median(xs)
        rows.append(
            [label, arm, len(xs), secs(med), secs(min(xs)), secs(max(xs)),
             ratio(pip_cold, med) if med > 0 else "n/a"]
        )  # fmt: skip
    return rows


def run(cfg: Config) -> dict[str, Any]:
    versions = cfg.pick(FIXTURE_VERSIONS, FIXTURE_VERSIONS[:1])
    out: dict[str, Any] = {"title": "3. Environment build time", "sets": {}}
    rows: list[list[str]] = []
    with reachable_tmpdir(prefix="bench-envs-") as tmp:
        work = Path(tmp)
        wheels = build_fixture(work / "wheels")
        with serve_index(wheels) as url:
            cfg.log(f"envs: fixture, {len(versions)} candidates")
            specs = [EnvSpec(package="leakyfixture", version=v, index_url=url) for v in versions]
            fx = measure(specs, work)
        label = (
            f"leakyfixture ({len(versions)} release{'s' if len(versions) > 1 else ''}, local index)"
        )
        out["sets"][label] = fx
        rows += _rows(label, fx)
        if not cfg.quick:
            cfg.log("envs: numpy + scipy from PyPI")
            specs = [
                EnvSpec(package=p, version=v, requirements=r, index_url=PYPI)
                for p, v, r in PYPI_CANDIDATES
            ]
            py = measure(specs, work)
            label = (
                "scipy + numpy==1.26.4 ("
                + ", ".join(f"scipy {v}" for _, v, _ in PYPI_CANDIDATES)
                + "; PyPI)"
            )
            out["sets"][label] = py
            rows += _rows(label, py)
    out["tables"] = [
        table(
            "Seconds to build one candidate's environment (median over the candidates)",
            [
                "set",
                "how",
                "candidates",
                "median s",
                "min s",
                "max s",
                "speed-up vs venv + pip cold",
            ],
            rows,
            "Cold: empty cache, everything downloaded. Warm: the cache already holds the "
            "candidate's files (filled by the cold build of the same candidate; for a "
            "bisection, the packages candidates share). Reused: the same spec again, found by "
            "its hash. pip's time includes `python -m venv` (which installs pip itself).",
        )  # fmt: skip
    ]
    out["headline"] = {
        label: {
            "uv_warm": statistics.median(t[ARMS[1]]),
            "uv_cold": statistics.median(t[ARMS[0]]),
            "pip_cold": statistics.median(t[ARMS[3]]),
            "pip_warm": statistics.median(t[ARMS[4]]),
        }
        for label, t in out["sets"].items()
    }
    return out


def notes(res: dict[str, Any]) -> list[str]:
    """What the numbers say, from the stored results."""
    out = []
    for label, t in res["sets"].items():
        med = {arm: statistics.median(t[arm]) for arm in ARMS}
        out.append(
            f"{label.split(' (')[0]}: uv with a warm shared cache {med[ARMS[1]]:.2f} s per "
            f"candidate, cold {med[ARMS[0]]:.2f} s; `python -m venv` + pip "
            f"{med[ARMS[3]]:.1f} s cold, {med[ARMS[4]]:.1f} s with a warm pip cache "
            f"({med[ARMS[3]] / med[ARMS[1]]:.0f}x and {med[ARMS[4]] / med[ARMS[1]]:.0f}x uv "
            "warm)."
        )
    out.append(
        "A warm pip cache saves only the download: pip still creates a venv with pip in it "
        "(`python -m venv` alone is most of the fixture's time) and unpacks every wheel, "
        "where uv hard-links the files from its cache (copies them when the runner is root)."
    )
    return out
