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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.signal import lfilter

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
# long enough run: 2 minutes, 20 for slow_leak (service.analysis documents why).
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
    seconds: float = 60,
    hz: float = 10,
    baseline_mib: float = 500,
    seed: int = 0,
    **params: float,
) -> tuple[np.ndarray, np.ndarray]:
    """One run without step markers: (t in seconds, memory in bytes).

    Sampling has a little jitter, as a real sampler's has. `gpu_plateau` imitates
    reserved GPU memory: no start-up ramp, no AR noise, values quantized to the
    allocator's segment size.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {sorted(SCENARIOS)}")
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
    steps: int = 40,
    step_s: float = 0.12,
    setup_s: float = 1.0,
    hz: float = 10,
    baseline_mib: float = 500,
    leak_mib_per_step: float = 2.0,
    seed: int = 0,
    **params: float,
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, int]]]:
    """A training-loop-like run that prints a marker as each step starts.

    Returns (t, bytes, markers) with markers as (t, step) pairs, steps numbered
    from 0. Before the first marker the script imports and sets up (memory ramps
    up to the baseline). Scenarios: `flat`; `leak` (each step keeps
    `leak_mib_per_step`); `spikes` (a checkpoint every 10 steps); `cache` (fills
    during the first half of the steps). Step durations jitter by ±20 %.
    """
    if scenario not in STEPPED_SCENARIOS:
        raise ValueError(f"unknown stepped scenario {scenario!r}; known: {STEPPED_SCENARIOS}")
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
