"""The leak classifier against synthetic traces with a known ground truth.

Everything here is seeded and pure, so verdicts are pinned exactly. Time-based
scenarios run for 2 minutes (the shortest run at which engine.analysis
documents them as reliable at the default noise), the slow leak for 20 minutes.
"""

import json

import numpy as np
import pytest

from engine import synthetic
from engine.analysis import (
    ClassifierSettings,
    aggregate,
    classify_run,
    classify_series,
    needs_more_runs,
)
from engine.verdicts import Verdict

L, C, P, INC, S, E = (
    Verdict.LEAK,
    Verdict.CLEAN,
    Verdict.PLATEAU,
    Verdict.INCONCLUSIVE,
    Verdict.SKIP,
    Verdict.ERROR,
)
MIB = 1024 * 1024
SECONDS = {"slow_leak": 1200.0}


def seconds(scenario: str) -> float:
    return SECONDS.get(scenario, 120.0)


def judge(scenario: str, seed: int = 0, **params: float):
    t, b = synthetic.trace(scenario, seconds=seconds(scenario), seed=seed, **params)
    return classify_series(t, b)


# ----------------------------------------------------------------- scenarios


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("flat", C),
        ("spikes", C),
        ("sawtooth", C),
        ("cache", P),
        # A one-off step with the last third of the run flat after it: the floor rose
        # once and stayed, which is what PLATEAU means (see engine.analysis).
        ("late_step", P),
        ("slow_leak", L),
        ("fast_leak", L),
        ("leak_spikes", L),
        ("gpu_plateau", P),
    ],
)
def test_scenario_verdict(scenario: str, expected: Verdict) -> None:
    a = judge(scenario)
    assert a.verdict is expected, a.reason
    assert synthetic.EXPECTED_VERDICT[scenario] == expected.value


def test_every_scenario_has_ground_truth_and_expectation() -> None:
    assert set(synthetic.SCENARIOS) == set(synthetic.EXPECTED_VERDICT)
    for scenario, truth in synthetic.SCENARIOS.items():
        assert truth in ("leak", "bounded")
        assert (truth == "leak") == (synthetic.EXPECTED_VERDICT[scenario] == "leak")


@pytest.mark.parametrize(
    "scenario", [s for s, truth in synthetic.SCENARIOS.items() if truth == "bounded"]
)
def test_bounded_scenarios_never_leak(scenario: str) -> None:
    verdicts = [judge(scenario, seed=1000 + i).verdict for i in range(50)]
    assert verdicts.count(L) == 0


@pytest.mark.parametrize(
    "scenario", [s for s, truth in synthetic.SCENARIOS.items() if truth == "leak"]
)
def test_leak_scenarios_leak(scenario: str) -> None:
    verdicts = [judge(scenario, seed=1000 + i).verdict for i in range(50)]
    assert verdicts.count(L) >= 48, verdicts


@pytest.mark.parametrize("step_at", [0.9, 0.95])
def test_step_at_the_very_end_is_inconclusive(step_at: float) -> None:
    # Could be a one-off or the first checkpoint of a leak: neither CLEAN nor LEAK.
    a = judge("late_step", step_at=step_at)
    assert a.verdict is INC, a.reason
    assert a.end_rise_mib is not None and a.end_rise_mib >= a.threshold_mib


def test_slow_leak_in_a_short_run_is_not_called_a_plateau() -> None:
    # 0.5 %/min reaches the 5 % threshold only after 10 judged minutes: a 5-minute
    # run cannot call it a leak, but must not call it bounded growth either.
    t, b = synthetic.trace("slow_leak", seconds=300, seed=0)
    assert classify_series(t, b).verdict in (C, INC)


def test_leak_numbers_are_carried() -> None:
    a = judge("fast_leak")
    assert a.unit == "MiB/s"
    # 20 %/min of 500 MiB = 1.67 MiB/s, over the judged 96 s: ~160 MiB.
    assert a.slope == pytest.approx(500 * 0.2 / 60, rel=0.1)
    assert a.slope_low < a.slope < a.slope_high
    assert a.growth_mib == pytest.approx(a.slope * a.window)
    assert a.window == pytest.approx(96, abs=1)
    # The first judged floor, 24 s (20 %) into the run: 500 + 1.67 x 24 MiB.
    assert a.baseline_mib == pytest.approx(540, abs=15)
    assert a.threshold_mib == pytest.approx(0.05 * a.baseline_mib)
    assert a.peak_mib > a.baseline_mib + 150
    assert len(a.floors_mib) == 30 and a.late_slope > 0
    assert a.samples == pytest.approx(960, abs=2)
    assert "MiB/s" in a.reason and "CI" in a.reason


# ------------------------------------------------------------ stepped runs


def test_short_stepped_leak_is_measured_per_step() -> None:
    t, b, markers = synthetic.stepped_trace("leak", steps=40, leak_mib_per_step=2.0, seed=0)
    assert 30 <= len(t) <= 60  # a tight 40-step loop sampled at 10 Hz
    a = classify_series(t, b, markers)
    assert a.verdict is L, a.reason
    assert a.unit == "MiB/step"
    assert a.slope == pytest.approx(2.0, abs=0.4)
    # Growth is over the judged steps (40 minus 2 warm-up ones): ~76 MiB.
    assert a.growth_mib == pytest.approx(80, rel=0.15)
    assert a.window <= 38
    assert "MiB/step" in a.reason and "steps" in a.reason


def test_short_stepped_flat_is_clean() -> None:
    t, b, markers = synthetic.stepped_trace("flat", steps=40, seed=0)
    a = classify_series(t, b, markers)
    assert a.verdict is C, a.reason
    assert a.unit == "MiB/step"


@pytest.mark.parametrize(("scenario", "expected"), [("spikes", C), ("cache", P)])
def test_short_stepped_bounded(scenario: str, expected: Verdict) -> None:
    t, b, markers = synthetic.stepped_trace(scenario, steps=40, seed=0)
    assert classify_series(t, b, markers).verdict is expected


def test_stepped_seeds() -> None:
    leaks = flats = 0
    for seed in range(50):
        t, b, m = synthetic.stepped_trace("leak", steps=40, seed=seed)
        leaks += classify_series(t, b, m).verdict is L
        t, b, m = synthetic.stepped_trace("flat", steps=40, seed=seed)
        flats += classify_series(t, b, m).verdict is L
    assert leaks >= 48
    assert flats == 0


def test_what_follows_the_last_marker_of_a_run_that_exited_is_never_judged() -> None:
    # CI, loaded: a 40-step leak whose sampler stalled 0.1 s in the last step block, then
    # the interpreter's exit freed 250 MiB within a step of the last marker. The thinned
    # last block's floor was that exit sample: "slowed down, but not clearly to a stop".
    t, b, markers = synthetic.stepped_trace("leak", steps=40, seed=0, hz=50)
    t, b = np.asarray(t), np.asarray(b, dtype=float)
    last = markers[-1][0]
    keep = (t < last - 0.25) | (t >= last - 0.1)  # the stall
    t, b = t[keep], b[keep]
    exit_t = t[-1] + np.array([0.02, 0.04])  # samples taken during the exit
    t, b = np.append(t, exit_t), np.append(b, [b[-1] - 250 * MIB] * 2)
    exited = classify_run(t, b, None, markers, exit_code=0, oom_killed=False, timed_out=False)
    assert exited.verdict is L, exited.reason
    # A run still going (or killed mid-step) has no teardown: its step in progress counts,
    # and here that makes the exit samples the last block's floor.
    assert classify_series(t, b, markers).verdict is not L


def test_a_stall_that_empties_a_block_cuts_the_blocks_finer() -> None:
    # CI, loaded: the sampler stalled 0.3 s of a 2 s, 40-step run; one of six blocks had
    # no samples and the run was "too few usable blocks: 5 of 6 have 3+ samples".
    t, b, markers = synthetic.stepped_trace("leak", steps=40, step_s=0.05, seed=0, hz=50)
    t, b = np.asarray(t), np.asarray(b, dtype=float)
    stalled = (t >= markers[20][0]) & (t < markers[20][0] + 0.35)
    a = classify_series(t[~stalled], b[~stalled], markers)
    assert a.verdict is L, a.reason
    assert len(a.floors_mib) >= 6
    # The same with too few samples left for six blocks is still too few.
    few = classify_series(t[:: 12], b[:: 12], markers)
    assert few.verdict is INC and few.reason.startswith("too few"), few.reason


def test_samples_before_the_first_marker_are_set_up() -> None:
    # The import ramp before the first marker must not read as growth.
    t, b, markers = synthetic.stepped_trace("flat", steps=40, setup_s=3.0, seed=2)
    assert classify_series(t, b, markers).verdict is C


def test_too_few_steps_falls_back_to_seconds() -> None:
    t, b = synthetic.trace("fast_leak", seconds=120, seed=0)
    markers = [(10.0, 0), (50.0, 1), (90.0, 2)]
    a = classify_series(t, b, markers)
    assert a.unit == "MiB/s"
    assert a.verdict is L


def test_markers_every_k_steps_still_give_per_step_slopes() -> None:
    t, b, markers = synthetic.stepped_trace("leak", steps=400, seed=0)
    every10 = [(mt, step) for mt, step in markers if step % 10 == 0]
    a = classify_series(t, b, every10)
    assert a.verdict is L and a.unit == "MiB/step"
    assert a.slope == pytest.approx(2.0, abs=0.1)


def test_step_counter_reset_falls_back_to_marker_count() -> None:
    t, b, markers = synthetic.stepped_trace("leak", steps=400, seed=0)
    per_epoch = [(mt, step % 100) for mt, step in markers]  # the counter restarts each epoch
    a = classify_series(t, b, per_epoch)
    assert a.verdict is L and a.unit == "MiB/step"
    assert a.slope == pytest.approx(2.0, abs=0.1)


# ------------------------------------------------------------- edge cases


def test_too_few_samples_is_inconclusive() -> None:
    t = np.arange(10) / 10
    a = classify_series(t, np.full(10, 500 * MIB))
    assert a.verdict is INC
    assert "too few samples" in a.reason
    assert a.slope is None and a.growth_mib is None


def test_no_samples_is_inconclusive() -> None:
    a = classify_series([], [])
    assert a.verdict is INC and a.samples == 0


def test_unknown_values_are_dropped() -> None:
    t, b = synthetic.trace("fast_leak", seconds=120, seed=0)
    values: list[float | None] = list(b)
    for i in range(0, len(values), 7):
        values[i] = None
    a = classify_series(t, values)
    assert a.verdict is L
    assert a.samples < 960


def test_perfectly_flat_series_is_clean() -> None:
    t = np.arange(600) / 10
    a = classify_series(t, np.full(600, 300 * MIB))
    assert a.verdict is C
    assert a.slope == 0 and a.growth_mib == 0


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="warmup_fraction"):
        ClassifierSettings(warmup_fraction=1.5)
    with pytest.raises(ValueError, match="max_blocks"):
        ClassifierSettings(min_blocks=10, max_blocks=8)


def test_thresholds_are_settings() -> None:
    t, b = synthetic.trace("fast_leak", seconds=120, seed=0)
    # ~160 MiB of growth is not a leak for a job that only cares about 1 GiB.
    strict = ClassifierSettings(min_growth_mib=1024)
    assert classify_series(t, b, settings=strict).verdict is not L


# -------------------------------------------------------------------- runs


def _pair(host: str, gpu: str, seed: int = 1, secs: float = 120.0):
    t, h = synthetic.trace(host, seconds=secs, seed=seed)
    t2, g = synthetic.trace(gpu, seconds=secs, seed=seed, baseline_mib=2000)
    assert np.array_equal(t, t2)
    return t, h, g


def run(t, h, g=None, steps=(), *, exit_code=0, oom_killed=False, timed_out=False, **kw):
    return classify_run(
        t, h, g, steps, exit_code=exit_code, oom_killed=oom_killed, timed_out=timed_out, **kw
    )


def test_clean_run() -> None:
    t, h, g = _pair("flat", "flat")
    r = run(t, h, g)
    assert r.verdict is C
    assert r.host.verdict is C and r.gpu is not None and r.gpu.verdict is C


def test_gpu_leak_with_flat_host_is_a_leak() -> None:
    t, h, g = _pair("flat", "fast_leak")
    r = run(t, h, g)
    assert r.verdict is L
    assert r.host.verdict is C and r.gpu.verdict is L
    assert r.reason.startswith("gpu leak")


def test_gpu_plateau_with_flat_host_is_a_plateau() -> None:
    t, h, g = _pair("flat", "gpu_plateau")
    r = run(t, h, g)
    assert r.verdict is P
    assert r.gpu.verdict is P


def test_gpu_unavailable() -> None:
    t, h = synthetic.trace("flat", seconds=120, seed=0)
    r = run(t, h, None)
    assert r.gpu is None and r.verdict is C
    # A source that never answered is unavailable too, not an inconclusive series.
    r = run(t, h, [None] * len(t))
    assert r.gpu is None and r.verdict is C


def test_inconclusive_series_makes_the_run_inconclusive() -> None:
    t, h, _ = _pair("flat", "flat")
    _, g = synthetic.trace("late_step", seconds=120, seed=1, step_at=0.9)
    assert run(t, h, g).verdict is INC


def test_exit_125_is_skip() -> None:
    t, h = synthetic.trace("fast_leak", seconds=120, seed=0)
    r = run(t, h, exit_code=125)
    assert r.verdict is S
    assert r.host.verdict is L  # the numbers are kept even so


def test_crash_is_error() -> None:
    t, h = synthetic.trace("flat", seconds=120, seed=0)
    r = run(t, h, exit_code=1)
    assert r.verdict is E
    assert r.reason == "crash, exit 1"
    assert run(t, h, exit_code=None).verdict is E


def test_crash_while_leaking_is_a_leak_unless_disabled() -> None:
    # A CUDA out-of-memory error is an exception and exit 1 after a GPU leak.
    t, h, g = _pair("flat", "fast_leak")
    r = run(t, h, g, exit_code=1)
    assert r.verdict is L and "exit 1" in r.reason
    strict = ClassifierSettings(crash_leak_is_leak=False)
    assert run(t, h, g, exit_code=1, settings=strict).verdict is E


def test_oom_with_rising_floor_is_a_leak() -> None:
    t, h = synthetic.trace("fast_leak", seconds=120, seed=0)
    r = run(t, h, exit_code=-9, oom_killed=True)
    assert r.verdict is L
    assert "memory cap" in r.reason


def test_oom_after_a_few_samples_with_rising_floor_is_a_leak() -> None:
    # Killed 1.2 s in: too few samples for blocks, but the floor rose ~40 MiB first.
    t = np.arange(12) / 10
    h = (400 + 50 * t) * MIB
    assert classify_series(t, h).verdict is INC
    r = run(t, h, exit_code=-9, oom_killed=True)
    assert r.verdict is L, r.reason
    assert r.host.rise_mib == pytest.approx(40, abs=10)
    assert r.host.rise_mib >= r.host.threshold_mib


def test_oom_without_rising_floor_is_an_error() -> None:
    t, h = synthetic.trace("flat", seconds=120, seed=0)
    r = run(t, h, exit_code=-9, oom_killed=True)
    assert r.verdict is E
    assert r.reason.startswith("killed by the memory cap without a rising floor")


def test_timeout() -> None:
    t, h = synthetic.trace("fast_leak", seconds=120, seed=0)
    r = run(t, h, exit_code=None, timed_out=True)
    assert r.verdict is L
    t, h = synthetic.trace("flat", seconds=120, seed=0)
    r = run(t, h, exit_code=None, timed_out=True)
    assert r.verdict is E
    assert r.reason.startswith("timed out after 120 s")


def test_to_dict_is_json() -> None:
    t, h, g = _pair("flat", "fast_leak")
    d = run(t, h, g).to_dict()
    text = json.dumps(d, allow_nan=False)
    back = json.loads(text)
    assert back["verdict"] == "leak"
    assert back["gpu"]["verdict"] == "leak" and back["gpu"]["unit"] == "MiB/s"
    assert isinstance(back["host"]["floors_mib"], list)
    short = run(np.arange(5) / 10, np.full(5, MIB), None).to_dict()
    assert short["gpu"] is None and short["host"]["slope"] is None
    json.dumps(short, allow_nan=False)


# --------------------------------------------------------------- aggregate


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([], INC),
        ([L], L),
        ([C], C),
        ([L, L, C], L),
        ([L, C], INC),  # tie between leaking and not
        ([L, P, C], P),  # not-leaking wins 2:1; plateau and clean tie -> plateau
        ([C, C, P], C),
        ([P, P, C], P),
        ([C, C, L], C),
        ([L, INC, INC], L),  # inconclusive runs are ignored when decisive runs agree
        ([L, L, C, INC, INC, INC], L),
        ([INC, INC], INC),
        ([S], S),
        ([S, S, S], S),
        ([E, E], E),
        ([S, E], S),
        ([E, INC], INC),
        ([E, L], L),
        ([S, C], C),
        (["leak", "leak", "clean"], L),
    ],
)
def test_aggregate(verdicts: list[Verdict], expected: Verdict) -> None:
    assert aggregate(verdicts) is expected


@pytest.mark.parametrize(
    ("verdicts", "repeats", "max_runs", "expected"),
    [
        ([], 3, 5, True),
        ([L, L], 3, 5, True),
        ([L, L, L], 3, 5, False),
        ([L, C, INC], 3, 5, True),  # tie: more runs
        ([L, C, INC, L], 3, 5, False),
        ([L, C, L, C, INC], 3, 5, False),  # still tied, but max_runs reached
        ([INC, INC, INC], 3, 3, False),
        ([S], 1, 5, False),
        ([E, E, E], 3, 5, False),
        ([C], 1, 1, False),
    ],
)
def test_needs_more_runs(
    verdicts: list[Verdict], repeats: int, max_runs: int, expected: bool
) -> None:
    assert needs_more_runs(verdicts, repeats, max_runs) is expected


# --------------------------------------------------------------- synthetic


def test_traces_are_seeded() -> None:
    t1, b1 = synthetic.trace("leak_spikes", seed=7)
    t2, b2 = synthetic.trace("leak_spikes", seed=7)
    _, b3 = synthetic.trace("leak_spikes", seed=8)
    assert np.array_equal(t1, t2) and np.array_equal(b1, b2)
    assert not np.array_equal(b1, b3)
    assert len(t1) == 600 and b1.dtype == np.int64


def test_trace_rejects_unknown_parameters_and_scenarios() -> None:
    with pytest.raises(TypeError, match="noise_mb"):
        synthetic.trace("flat", noise_mb=5)
    with pytest.raises(ValueError, match="unknown scenario"):
        synthetic.trace("nope")


def test_noise_amplitude_is_configurable() -> None:
    _, quiet = synthetic.trace("flat", seed=0, noise_mib=0.5)
    _, loud = synthetic.trace("flat", seed=0, noise_mib=10)
    tail = slice(100, None)  # after the start-up ramp
    assert np.std(loud[tail]) > 5 * np.std(quiet[tail])
