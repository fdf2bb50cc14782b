"""6. Speed: bisect-cli against the naive venv + pip loop, in the same run, on two ranges.

- **the bundled fixture**: leakyfixture 1.0.0..1.0.9, first bad 1.0.6 (as in section 5);
- **a generated 32-release range**: leakyfixture 1.0.0..1.0.31, first bad 1.0.21, the same
  noise (spikes, a cache, churn) in every release, nothing yanked or untestable.

Each is searched by the naive loop of section 5 (`bench.e2e.NAIVE_LOOP`: from the good end,
one `python -m venv` + `pip install` + run per release until one grows by 8 MiB) and by
`bisect-cli run` with a warm uv cache (the cache a first, cold run filled; a developer's
machine has one) and a fresh database, in three arms: sequentially with every trial run to
its end (`--jobs 1 --no-early-stop`), sequentially with early stopping (the default), and
with two trials side by side (`--jobs 2`). Each arm's wall time includes building its
environments. The quick run (CI's) does the fixture only and `--jobs 2`, and takes the loop's
time from section 5, which ran the same loop over the same fixture earlier in the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import Config, reachable_tmpdir, secs, table
from bench.e2e import NAIVE_BUNDLED, REPRO, bisect_cli, naive_loop
from service.example.fixture import FixtureSpec, build_fixture
from service.example.index import serve_index

GENERATED = FixtureSpec(
    versions=tuple(f"1.0.{i}" for i in range(32)),
    first_leaking="1.0.21",
    prerelease=None,
    yanked={},
    foreign_only=None,
)
RANGES = [
    ("bundled fixture, 10 releases", FixtureSpec(), "1.0.6"),
    ("generated range, 32 releases", GENERATED, "1.0.21"),
]
# The bisect-cli arms: sequential without early stopping (every trial to its end), then
# with it (the default), then two trials side by side.
ARMS = (("--jobs", "1", "--no-early-stop"), ("--jobs", "1"), ("--jobs", "2"))
# Warm runs per bisect-cli arm in a full run; the naive loop runs this many times too.
REPEATS = 2


def _range_runs(cfg: Config, work: Path, label: str, spec: FixtureSpec, expected: str) -> list:
    versions = list(spec.versions)
    span = f"{versions[0]}..{versions[-1]}"
    runs: list[dict[str, Any]] = []
    with serve_index(build_fixture(work / "wheels", spec)) as url:
        cfg.log(f"speed: {label}: filling the uv cache (cold run, not counted)")
        cold = work / "cold"
        bisect_cli(REPRO, url, cold, None, span=span, expected=expected)
        for a, arm in enumerate(cfg.pick(ARMS, ARMS[-1:])):
            how = "bisect-cli run " + " ".join(arm)
            for k in range(cfg.pick(REPEATS, 1)):
                cfg.log(f"speed: {label}: {how}, run {k + 1}")
                run = bisect_cli(
                    REPRO, url, work / f"cli-{a}-{k}", cold / "cache" / "uv",
                    span=span, expected=expected, extra=arm,
                )  # fmt: skip
                runs.append({"range": label, "how": how, **run})
        for k in range(cfg.pick(REPEATS, 1)):
            run = cfg.measured.get(NAIVE_BUNDLED) if spec == FixtureSpec() else None
            if run is not None:  # a quick run: section 5 ran this very loop
                cfg.log(f"speed: {label}: naive loop, section 5's run")
            else:
                cfg.log(f"speed: {label}: naive loop, run {k + 1}")
                run = naive_loop(REPRO, url, work / f"naive-{k}", versions, expected)
            runs.append({"range": label, "how": "naive loop: venv + pip", **run})
    return runs


def run(cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {"title": "6. Speed", "runs": []}
    with reachable_tmpdir(prefix="bench-speed-") as tmp:
        for i, (label, spec, expected) in enumerate(RANGES[: cfg.pick(len(RANGES), 1)]):
            work = Path(tmp) / f"range-{i}"
            out["runs"] += _range_runs(cfg, work, label, spec, expected)
    out["tables"] = [
        table(
            "Wall time to the first bad release (mean of the runs; every run's answer)",
            ["range", "how", "runs", "mean wall s", "naive ÷ this", "answers", "trials",
             "stopped early"],
            _rows(out["runs"]),
            "naive ÷ this: the naive loop's mean wall time over this arm's, same range, same "
            "run. Trials: repro executions (the naive loop: releases it ran).",
        )
    ]
    return out


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (range, how): mean wall, runs, answers, and the naive loop's ratio."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["range"], r["how"]), []).append(r)
    naive = {
        rng: sum(r["wall_s"] for r in rs) / len(rs)
        for (rng, how), rs in groups.items()
        if how.startswith("naive")
    }
    out = []
    for (rng, how), rs in groups.items():
        wall = sum(r["wall_s"] for r in rs) / len(rs)
        out.append({
            "range": rng, "how": how, "n": len(rs), "wall_s": wall,
            "speedup": naive[rng] / wall if rng in naive and wall > 0 else None,
            "answers": [r["answer"] or r["status"] for r in rs],
            "right": sum(r["right"] for r in rs),
            "trials": [r["runs"] for r in rs],
            "stopped": [r.get("stopped_early") for r in rs],
        })  # fmt: skip
    return out


def _rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [s["range"], s["how"], str(s["n"]), secs(s["wall_s"]),
         "" if s["speedup"] is None or s["how"].startswith("naive") else f"{s['speedup']:.1f}x",
         ", ".join(s["answers"]), ", ".join(str(t) for t in s["trials"]),
         "" if s["how"].startswith("naive") else ", ".join(str(n) for n in s["stopped"])]
        for s in summary(runs)
    ]  # fmt: skip


def notes(res: dict[str, Any]) -> list[str]:
    out = []
    for s in summary(res["runs"]):
        if s["how"].startswith("naive") or s["speedup"] is None:
            continue
        target = "meets" if s["speedup"] >= 3 else "misses"
        out.append(
            f"{s['range']}: `{s['how']}` took {s['wall_s']:.1f} s on average, "
            f"{s['speedup']:.1f}x faster than the naive loop ({target} the 3x target); "
            f"right in {s['right']} of {s['n']}."
        )
    return out

