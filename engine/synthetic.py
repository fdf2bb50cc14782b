"""Seeded synthetic memory traces with a known ground truth.

The classifier is tuned and tested against these, and benchmarks reuse them,
so each scenario imitates a shape seen in real reports rather than an easy
textbook curve: memory noise is autocorrelated (AR(1)), processes start with
an import ramp, checkpoint spikes are hundreds of MiB, GPU reserved memory is
quantized by the caching allocator.

`trace()` gives a run without step markers (judged per second);
`stepped_trace()` gives a short training-loop-like run that prints step
markers (judged per step).

Every parameter a scenario reads can be overridden through `**params`; the
defaults are listed in `DEFAULTS`. Unknown parameters are rejected so a typo
in a benchmark cannot silently fall back to a default.

The realistic corpus (`CORPUS`, with `CORPUS_TEXT`): the shapes real ML packages
have, each on top of a heavy import ramp (100-500 MiB over 1-10 s, module after
module), in both forms: `corpus_trace` (no markers: the import opens the run) and
`corpus_stepped` (the import is the set-up before the first marker); `trace` and
`stepped_trace` take these names too. Bounded: the import alone, a thread pool
starting late, JIT warm-up, a generational GC that grows and settles, glibc malloc
arenas growing with threads, memory-mapped pages touched then kept (or partly
reclaimed), an allocator returning memory late, a model loaded after the first
marker; leaks: slow, fast and with checkpoint spikes, each after the import. Every
size, duration and moment is drawn per seed from `CORPUS_PARAMS` (an override fixes
one); `slow` stretches a run as a loaded machine does. `CORPUS_SECONDS` and
`CORPUS_STEPS` are the run lengths at which every leak is found.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MIB = 1024 * 1024

# Ground truth per scenario: "leak" means memory grows without bound for as long
# as the script runs; "bounded" means it does not, however it wiggles.
SCENARIOS: dict[str, str] = {
    "flat": "bounded",
    "spikes": "bounded",
    "sawtooth": "bounded",
    "cache": "bounded",
    "late_step": "bounded",
    "slow_leak": "leak",
    "fast_leak": "leak",
    "leak_spikes": "leak",
    "gpu_plateau": "bounded",
}

# The verdict a correct classifier gives each scenario at its default parameters and a
# long enough run: 2 minutes, 20 for slow_leak (engine.analysis documents why).
EXPECTED_VERDICT: dict[str, str] = {
    "flat": "clean",
    "spikes": "clean",
    "sawtooth": "clean",
    "cache": "plateau",
    "late_step": "plateau",
    "slow_leak": "leak",
    "fast_leak": "leak",
    "leak_spikes": "leak",
    "gpu_plateau": "plateau",
}

DEFAULTS: dict[str, float] = {
    # AR(1) noise: stationary standard deviation and correlation time. Real RSS wanders
    # by a few MiB as the allocator grabs and returns arenas, over seconds, not samples.
    "noise_mib": 3.0,
    "noise_tau_s": 2.0,
    # Start-up: imports and first allocations ramp memory up to the baseline.
    "startup_s": 3.0,
    "startup_from_mib": 60.0,
    # Checkpoint-like spikes: a buffer grows while serializing, then is freed at once.
    "spike_mib": 300.0,
    "spike_period_s": 10.0,
    "spike_s": 1.5,
    # GC sawtooth: garbage accumulates, a collection drops it back.
    "saw_mib": 50.0,
    "saw_period_s": 5.0,
    # Cache: fills between the two fractions of the run, at a decreasing rate, then stops.
    "cache_mib": 150.0,
    "cache_start": 0.1,
    "cache_end": 0.45,
    # One persistent allocation late in the run (a first checkpoint, a lazily built table).
    "step_mib": 120.0,
    "step_at": 0.65,
    # Leak rates as a fraction of the baseline per minute. 0.5 %/min is the "slow" leak
    # of the brief: 2.5 MiB/min on a 500 MiB process.
    "slow_leak_per_min": 0.005,
    "fast_leak_per_min": 0.2,
    "leak_spikes_per_min": 0.1,
    # GPU reserved memory: a few allocator segments grabbed early, then steady.
    "gpu_jump_mib": 200.0,
    "gpu_jumps": 3,
    "gpu_jump_start": 0.25,
    "gpu_jump_end": 0.45,
    "gpu_quantum_mib": 2.0,
}


def _params(overrides: dict[str, Any]) -> dict[str, float]:
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown trace parameters: {sorted(unknown)}")
    return {**DEFAULTS, **overrides}


def ar1_noise(
    n: int, hz: float, sigma: float, tau_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Stationary AR(1) noise with standard deviation `sigma` and correlation time `tau_s`."""
    if n == 0 or sigma <= 0:
        return np.zeros(n)
    phi = float(np.exp(-1.0 / (hz * tau_s))) if tau_s > 0 else 0.0
    innovations = rng.standard_normal(n) * sigma * np.sqrt(1.0 - phi * phi)
    # Start in the stationary distribution so the first samples are not special.
    zi = np.array([phi * rng.standard_normal() * sigma])
    # scipy is a development dependency: synthetic traces are for the tests and benchmarks.
    from scipy.signal import lfilter

    out, _ = lfilter([1.0], [1.0, -phi], innovations, zi=zi)
    return out


def _startup(t: np.ndarray, p: dict[str, float], baseline: float) -> np.ndarray:
    """Offset (<= 0) that ramps from `startup_from_mib` up to the baseline."""
    if p["startup_s"] <= 0:
        return np.zeros_like(t)
    frac = np.clip(t / p["startup_s"], 0.0, 1.0)
    # Concave: most of the imports' memory arrives early.
    return -(baseline - p["startup_from_mib"]) * (1.0 - frac) ** 2


def _spikes(t: np.ndarray, p: dict[str, float], rng: np.random.Generator) -> np.ndarray:
    out = np.zeros_like(t)
    period, width, height = p["spike_period_s"], p["spike_s"], p["spike_mib"]
    if period <= 0 or width <= 0 or height <= 0 or len(t) == 0:
        return out
    start = rng.uniform(0.3, 1.0) * period
    while start < t[-1]:
        h = height * rng.uniform(0.8, 1.2)
        w = width * rng.uniform(0.7, 1.3)
        inside = (t >= start) & (t < start + w)
        # The buffer grows while serializing and is freed in one go at the end.
        out[inside] += h * np.sqrt((t[inside] - start) / w)
        start += period * rng.uniform(0.8, 1.2)
    return out


def _sawtooth(t: np.ndarray, p: dict[str, float], rng: np.random.Generator) -> np.ndarray:
    out = np.zeros_like(t)
    period, height = p["saw_period_s"], p["saw_mib"]
    if period <= 0 or height <= 0 or len(t) == 0:
        return out
    start = -rng.uniform(0.0, 1.0) * period
    while start < t[-1]:
        length = period * rng.uniform(0.7, 1.3)
        peak = height * rng.uniform(0.7, 1.3)
        inside = (t >= start) & (t < start + length)
        out[inside] = peak * (t[inside] - start) / length
        start += length
    return out


def _profile(
    scenario: str,
    t: np.ndarray,
    seconds: float,
    baseline: float,
    p: dict[str, float],
    rng: np.random.Generator,
) -> np.ndarray:
    """The scenario's deterministic shape (MiB above the baseline), before noise."""
    u = t / seconds if seconds > 0 else np.zeros_like(t)
    zero = np.zeros_like(t)
    if scenario == "flat":
        return zero
    if scenario == "spikes":
        return _spikes(t, p, rng)
    if scenario == "sawtooth":
        return _sawtooth(t, p, rng)
    if scenario == "cache":
        span = max(p["cache_end"] - p["cache_start"], 1e-9)
        v = np.clip((u - p["cache_start"]) / span, 0.0, 1.0)
        # Hit rate improves as the cache fills, so it grows ever more slowly until full.
        return p["cache_mib"] * (1.0 - (1.0 - v) ** 2)
    if scenario == "late_step":
        at = p["step_at"] * seconds
        return p["step_mib"] * np.clip((t - at) / 1.0, 0.0, 1.0)
    if scenario == "slow_leak":
        return baseline * p["slow_leak_per_min"] * t / 60.0
    if scenario == "fast_leak":
        return baseline * p["fast_leak_per_min"] * t / 60.0
    if scenario == "leak_spikes":
        return baseline * p["leak_spikes_per_min"] * t / 60.0 + _spikes(t, p, rng)
    if scenario == "gpu_plateau":
        out = zero.copy()
        n = max(int(p["gpu_jumps"]), 1)
        times = np.sort(rng.uniform(p["gpu_jump_start"], p["gpu_jump_end"], n)) * seconds
        sizes = rng.dirichlet(np.ones(n)) * p["gpu_jump_mib"]
        for at, size in zip(times, sizes, strict=True):
            out[t >= at] += size
        return out
    raise ValueError(f"unknown scenario {scenario!r}; known: {sorted(SCENARIOS)}")


def trace(
    scenario: str,
    *,
    seconds: float | None = None,
    hz: float = 10,
    baseline_mib: float = 500,
    seed: int = 0,
    **params: float,
) -> tuple[np.ndarray, np.ndarray]:
    """One run without step markers: (t in seconds, memory in bytes); `seconds` long
    (default 60, or the scenario's CORPUS_SECONDS).

    Sampling has a little jitter, as a real sampler's has. `gpu_plateau` imitates
    reserved GPU memory: no start-up ramp, no AR noise, values quantized to the
    allocator's segment size. A CORPUS scenario is `corpus_trace` (its level is set by
    its import, so `baseline_mib` does not apply; `slow` may be among `params`).
    """
    if scenario in CORPUS:
        return corpus_trace(scenario, seconds=seconds, hz=hz, seed=seed, **params)
    if scenario not in SCENARIOS:
        known = sorted(SCENARIOS) + sorted(CORPUS)
        raise ValueError(f"unknown scenario {scenario!r}; known: {known}")
    seconds = 60.0 if seconds is None else seconds
    p = _params(params)
    rng = np.random.default_rng(seed)
    n = max(int(seconds * hz), 0)
    t = np.arange(n) / hz + rng.uniform(0.0, 0.2 / hz, n)
    shape = _profile(scenario, t, seconds, baseline_mib, p, rng)
    if scenario == "gpu_plateau":
        mib = baseline_mib + shape
        q = p["gpu_quantum_mib"]
        if q > 0:
            mib = np.round(mib / q) * q
    else:
        noise = ar1_noise(n, hz, p["noise_mib"], p["noise_tau_s"], rng)
        mib = baseline_mib + shape + noise + _startup(t, p, baseline_mib)
    return t, np.round(np.maximum(mib, 0.0) * MIB).astype(np.int64)


STEPPED_SCENARIOS = ("flat", "leak", "spikes", "cache")


def stepped_trace(
    scenario: str = "leak",
    *,
    steps: int | None = None,
    step_s: float | None = None,
    setup_s: float = 1.0,
    hz: float = 10,
    baseline_mib: float = 500,
    leak_mib_per_step: float = 2.0,
    seed: int = 0,
    **params: float,
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, int]]]:
    """A training-loop-like run that prints a marker as each step starts.

    `steps` (default 40, or the scenario's CORPUS_STEPS) of `step_s` (default 0.12 s,
    1 s for a CORPUS scenario). Returns (t, bytes, markers) with markers as (t, step)
    pairs, steps numbered from 0. Before the first marker the script imports and sets
    up (memory ramps up to the baseline). Scenarios: `flat`; `leak` (each step keeps
    `leak_mib_per_step`); `spikes` (a checkpoint every 10 steps); `cache` (fills
    during the first half of the steps). Step durations jitter by ±20 %. A CORPUS
    scenario is `corpus_stepped`: its set-up is its import, so `setup_s`,
    `baseline_mib` and `leak_mib_per_step` do not apply.
    """
    if scenario in CORPUS:
        return corpus_stepped(
            scenario, steps=steps, step_s=1.0 if step_s is None else step_s, hz=hz, seed=seed,
            **params,
        )  # fmt: skip
    if scenario not in STEPPED_SCENARIOS:
        known = [*STEPPED_SCENARIOS, *sorted(CORPUS)]
        raise ValueError(f"unknown stepped scenario {scenario!r}; known: {known}")
    steps = 40 if steps is None else steps
    step_s = 0.12 if step_s is None else step_s
    p = _params(params)
    rng = np.random.default_rng(seed)
    durations = step_s * rng.uniform(0.8, 1.2, steps)
    starts = setup_s + np.concatenate([[0.0], np.cumsum(durations)[:-1]])
    end = setup_s + float(np.sum(durations))
    n = max(int(end * hz), 0)
    t = np.arange(n) / hz + rng.uniform(0.0, 0.2 / hz, n)
    step_of = np.searchsorted(starts, t, side="right") - 1  # -1 before the first marker
    k = np.maximum(step_of, 0).astype(float)
    if scenario == "flat":
        shape = np.zeros_like(t)
    elif scenario == "leak":
        # What a step leaks shows up once the step finishes, so step k holds k steps' worth.
        shape = leak_mib_per_step * k
    elif scenario == "spikes":
        shape = np.where((step_of >= 0) & (step_of % 10 == 9), p["spike_mib"], 0.0)
    else:  # cache
        v = np.clip(k / max(steps / 2, 1), 0.0, 1.0)
        shape = p["cache_mib"] * (1.0 - (1.0 - v) ** 2)
    startup = dict(p)
    startup["startup_s"] = setup_s
    noise = ar1_noise(n, hz, p["noise_mib"], p["noise_tau_s"], rng)
    mib = baseline_mib + shape + noise + _startup(t, startup, baseline_mib)
    markers = [(float(s), i) for i, s in enumerate(starts)]
    return t, np.round(np.maximum(mib, 0.0) * MIB).astype(np.int64), markers


# ------------------------------------------------------------------ realistic corpus

# Shapes real ML packages have (issue #23), every one on top of a heavy import ramp, in
# both forms: `trace` (no markers: the ramp is the start of the run) and `stepped_trace`
# (the ramp is the set-up before the first marker). Ground truth as in SCENARIOS.
CORPUS: dict[str, str] = {
    "import_ramp": "bounded",
    "late_threads": "bounded",
    "jit_warmup": "bounded",
    "gc_settles": "bounded",
    "malloc_arenas": "bounded",
    "mmap_pages": "bounded",
    "mmap_reclaim": "bounded",
    "late_release": "bounded",
    "model_load": "bounded",
    "ramp_slow_leak": "leak",
    "ramp_fast_leak": "leak",
    "ramp_leak_spikes": "leak",
}

CORPUS_TEXT: dict[str, str] = {
    "import_ramp": "heavy import ramp (100-500 MiB over 1-10 s), then flat",
    "late_threads": "thread pool starting late (20-100 MiB at 20-60 % of the run)",
    "jit_warmup": "JIT/compile warm-up (50-300 MiB, settled by 5-20 % of the run)",
    "gc_settles": "generational GC: sawtooth whose floor grows 10-60 MiB, then settles",
    "malloc_arenas": "glibc malloc arenas: 4-16 of 4-16 MiB as threads start",
    "mmap_pages": "memory-mapped file: 100-400 MiB of pages touched, then kept",
    "mmap_reclaim": "memory-mapped file, then 30-70 % of its pages reclaimed",
    "late_release": "allocator returns memory late: 100-300 MiB high, dropped at 60-90 %",
    "model_load": "model of 200-1000 MiB loaded after the first marker (1-5 s)",
    "ramp_slow_leak": "slow leak after the import (3 %/min; 0.08 %/step)",
    "ramp_fast_leak": "fast leak after the import (20 %/min; 0.5 %/step)",
    "ramp_leak_spikes": "leak (10 %/min; 0.25 %/step) + checkpoint spikes",
}

# The run length at which the classifier finds every leak of the corpus (and judges its
# bounded shapes): 5 minutes without markers, 200 steps of about 1 s with them; the slow
# leak needs 10 minutes or 300 steps (tests/test_synthetic_corpus.py pins the verdicts).
CORPUS_SECONDS: dict[str, float] = {"ramp_slow_leak": 600.0}
CORPUS_STEPS: dict[str, int] = {"ramp_slow_leak": 300}

# Each shape's parameters: (low, high), drawn uniformly per seed in this order; an
# override fixes one (`import_mib=200`). Fractions are of the run after the import (time
# form) or of its steps (stepped form); leak rates are of the level after the import.
CORPUS_PARAMS: dict[str, tuple[float, float]] = {
    "interp_mib": (15.0, 40.0),
    "import_mib": (100.0, 500.0),
    "import_s": (1.0, 10.0),
    "import_chunks": (20.0, 60.0),
    "threads_mib": (20.0, 100.0),
    "threads_at": (0.2, 0.6),
    "threads_s": (0.5, 2.0),
    "jit_mib": (50.0, 300.0),
    "jit_end": (0.05, 0.2),
    "gc_mib": (10.0, 60.0),
    "gc_end": (0.1, 0.3),
    "gc_saw_mib": (20.0, 80.0),
    "gc_period_s": (2.0, 8.0),
    "arenas": (4.0, 16.0),
    "arena_mib": (4.0, 16.0),
    "arenas_end": (0.05, 0.3),
    "mmap_mib": (100.0, 400.0),
    "mmap_end": (0.1, 0.25),
    "reclaim_at": (0.4, 0.9),
    "reclaim_share": (0.3, 0.7),
    "late_mib": (100.0, 300.0),
    "late_burst_end": (0.02, 0.1),
    "late_drop_at": (0.6, 0.9),
    "model_mib": (200.0, 1000.0),
    "model_s": (1.0, 5.0),
    "model_at": (0.0, 0.05),
    "slow_per_min": (0.03, 0.03),
    "fast_per_min": (0.2, 0.2),
    "spikes_per_min": (0.1, 0.1),
    "slow_per_step": (0.0008, 0.0008),
    "fast_per_step": (0.005, 0.005),
    "spikes_per_step": (0.0025, 0.0025),
    "spike_mib": (100.0, 300.0),
    "spike_period_s": (8.0, 15.0),
    "noise_mib": (3.0, 3.0),
    "noise_tau_s": (2.0, 2.0),
}


def _draw(overrides: dict[str, float], rng: np.random.Generator) -> dict[str, float]:
    """Every corpus parameter, drawn in CORPUS_PARAMS order (an override still draws, so
    fixing one parameter leaves the others as the seed gives them)."""
    unknown = set(overrides) - set(CORPUS_PARAMS)
    if unknown:
        raise TypeError(f"unknown corpus parameters: {sorted(unknown)}")
    drawn = {k: float(rng.uniform(lo, hi)) for k, (lo, hi) in CORPUS_PARAMS.items()}
    return {**drawn, **{k: float(v) for k, v in overrides.items()}}


def _import_ramp(tau: np.ndarray, p: dict[str, float], rng: np.random.Generator) -> np.ndarray:
    """MiB imported by work time tau: modules one after another (chunks of random size at
    random times over import_s, each over its share of the time), not a smooth curve."""
    n = max(int(p["import_chunks"]), 1)
    starts = np.sort(rng.uniform(0.0, p["import_s"], n))
    sizes = rng.dirichlet(np.ones(n)) * p["import_mib"]
    width = p["import_s"] / n
    out = np.zeros_like(tau)
    for at, size in zip(starts, sizes, strict=True):
        out += size * np.clip((tau - at) / width, 0.0, 1.0)
    return out


def _ease(u: np.ndarray, start: float, end: float) -> np.ndarray:
    """0 before `start`, 1 after `end`, linear between."""
    return np.clip((u - start) / max(end - start, 1e-9), 0.0, 1.0)


def _bounded_shape(
    scenario: str, u: np.ndarray, run_s: float, p: dict[str, float], rng: np.random.Generator
) -> np.ndarray:
    """A bounded corpus shape (MiB) at run fraction u of a run of `run_s` work seconds."""
    sec = 1.0 / max(run_s, 1e-9)  # one second as a run fraction
    zero = np.zeros_like(u)
    if scenario == "import_ramp":
        return zero
    if scenario == "late_threads":
        return p["threads_mib"] * _ease(u, p["threads_at"], p["threads_at"] + p["threads_s"] * sec)
    if scenario == "jit_warmup":  # 95 % compiled by jit_end
        return p["jit_mib"] * (1.0 - np.exp(-3.0 * np.maximum(u, 0.0) / p["jit_end"]))
    if scenario == "gc_settles":
        settle = 1.0 - np.exp(-3.0 * np.maximum(u, 0.0) / p["gc_end"])
        phase = (u / (p["gc_period_s"] * sec)) % 1.0  # garbage piles up, a collection frees it
        return settle * (p["gc_mib"] + p["gc_saw_mib"] * phase)
    if scenario == "malloc_arenas":
        n = max(int(p["arenas"]), 1)
        born = np.sort(rng.beta(1.0, 2.0, n)) * p["arenas_end"]
        return sum(p["arena_mib"] * _ease(u, b, b + 2.0 * sec) for b in born) + zero
    if scenario in ("mmap_pages", "mmap_reclaim"):
        touched = p["mmap_mib"] * _ease(u, 0.0, p["mmap_end"])
        if scenario == "mmap_reclaim":
            at = max(p["reclaim_at"], p["mmap_end"])
            touched -= p["reclaim_share"] * p["mmap_mib"] * _ease(u, at, at + 2.0 * sec)
        return touched
    if scenario == "late_release":
        high = p["late_mib"] * _ease(u, 0.0, p["late_burst_end"])
        return high - 0.9 * p["late_mib"] * _ease(u, p["late_drop_at"], p["late_drop_at"] + sec)
    if scenario == "model_load":
        return p["model_mib"] * _ease(u, p["model_at"], p["model_at"] + p["model_s"] * sec)
    raise ValueError(f"unknown corpus scenario {scenario!r}; known: {sorted(CORPUS)}")


def _corpus_shape(
    scenario: str, u: np.ndarray, run_s: float, grown: np.ndarray, tau_run: np.ndarray,
    p: dict[str, float], rng: np.random.Generator,
) -> np.ndarray:  # fmt: skip
    """The shape after the import: bounded, or `grown` (the leak) plus spikes."""
    if scenario not in ("ramp_slow_leak", "ramp_fast_leak", "ramp_leak_spikes"):
        return _bounded_shape(scenario, u, run_s, p, rng)
    if scenario != "ramp_leak_spikes":
        return grown
    spikes = {"spike_period_s": p["spike_period_s"], "spike_s": 1.5, "spike_mib": p["spike_mib"]}
    return grown + _spikes(tau_run, spikes, rng)


def _finish(
    t: np.ndarray, mib: np.ndarray, hz: float, p: dict[str, float], rng: np.random.Generator
) -> np.ndarray:
    noise = ar1_noise(len(t), hz, p["noise_mib"], p["noise_tau_s"], rng)
    return np.round(np.maximum(mib + noise, 0.0) * MIB).astype(np.int64)


def corpus_trace(
    scenario: str, *, seconds: float | None = None, hz: float = 10, seed: int = 0,
    slow: float = 1.0, **params: float,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """A corpus run without markers: (t, bytes). `seconds` of work (default CORPUS_SECONDS),
    the import first; `slow` stretches everything (a loaded machine): it lasts seconds x slow."""
    if scenario not in CORPUS:
        raise ValueError(f"unknown corpus scenario {scenario!r}; known: {sorted(CORPUS)}")
    seconds = CORPUS_SECONDS.get(scenario, 300.0) if seconds is None else seconds
    rng = np.random.default_rng(seed)
    p = _draw(params, rng)
    n = max(int(seconds * slow * hz), 0)
    t = np.arange(n) / hz + rng.uniform(0.0, 0.2 / hz, n)
    tau = t / slow
    level = p["interp_mib"] + p["import_mib"]
    run_s = max(seconds - p["import_s"], 1e-9)
    after = np.maximum(tau - p["import_s"], 0.0)
    rate = {"ramp_slow_leak": "slow_per_min", "ramp_fast_leak": "fast_per_min",
            "ramp_leak_spikes": "spikes_per_min"}.get(scenario)  # fmt: skip
    grown = level * p[rate] * after / 60.0 if rate else np.zeros_like(t)
    shape = _corpus_shape(scenario, after / run_s, run_s, grown, after, p, rng)
    mib = p["interp_mib"] + _import_ramp(tau, p, rng) + shape
    return t, _finish(t, mib, hz, p, rng)


def corpus_stepped(
    scenario: str, *, steps: int | None = None, step_s: float = 1.0, hz: float = 10,
    seed: int = 0, slow: float = 1.0, **params: float,
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, int]]]:  # fmt: skip
    """A corpus run that prints a marker as each step starts: (t, bytes, markers); `steps`
    default CORPUS_STEPS. The import is the set-up before the first marker; steps jitter by
    ±20 %; `slow` stretches the set-up and every step. What a step leaks shows once it
    finishes."""
    if scenario not in CORPUS:
        raise ValueError(f"unknown corpus scenario {scenario!r}; known: {sorted(CORPUS)}")
    steps = CORPUS_STEPS.get(scenario, 200) if steps is None else steps
    rng = np.random.default_rng(seed)
    p = _draw(params, rng)
    durations = step_s * rng.uniform(0.8, 1.2, steps)
    starts = p["import_s"] + np.concatenate([[0.0], np.cumsum(durations)[:-1]])
    end = p["import_s"] + float(np.sum(durations))
    n = max(int(end * slow * hz), 0)
    t = np.arange(n) / hz + rng.uniform(0.0, 0.2 / hz, n)
    tau = t / slow
    k = np.searchsorted(starts, tau, side="right") - 1  # the step under way; -1: set-up
    into = (tau - starts[np.maximum(k, 0)]) / durations[np.maximum(k, 0)]
    progress = np.where(k >= 0, k + np.clip(into, 0.0, 1.0), 0.0)  # steps done, fractional
    level = p["interp_mib"] + p["import_mib"]
    rate = {"ramp_slow_leak": "slow_per_step", "ramp_fast_leak": "fast_per_step",
            "ramp_leak_spikes": "spikes_per_step"}.get(scenario)  # fmt: skip
    grown = level * p[rate] * np.maximum(k, 0) if rate else np.zeros_like(t)
    after = np.maximum(tau - p["import_s"], 0.0)
    shape = _corpus_shape(scenario, progress / steps, steps * step_s, grown, after, p, rng)
    mib = p["interp_mib"] + _import_ramp(tau, p, rng) + shape
    markers = [(float(s * slow), i) for i, s in enumerate(starts)]
    return t, _finish(t, mib, hz, p, rng), markers
