"""Verdicts that do not depend on the repro's pace: the classifier's rules on generated
traces read as a trial reads them (a reading at every step marker, the clock between).

- per-step floors: an unpaced loop (a few ms a step) is judged per step, LEAK or CLEAN,
  where the 10 Hz clock alone gave "too few samples";
- the minimum in steps: 21 markers are always enough, 20 are not;
- a spike longer than a block (a 200 MB buffer touched for over a second on a loaded
  machine) is an excursion, never a floor;
- runs too short to judge alone are pooled: LEAK from three, CLEAN from two, never a
  cache filling in each run's first steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from contract.floors import block_floors, excursions, judged_part
from engine.analysis import ClassifierSettings, classify_run, classify_series, enough_markers
from engine.pooled import PooledRun, classify_runs
from engine.verdicts import Verdict

MIB = 1024 * 1024
TRACES = Path(__file__).with_name("traces")
S = ClassifierSettings()


def unpaced(
    *,
    steps: int = 50,
    step_s: float = 0.006,
    leak_mib: float = 0.0,
    temp_mib: float = 32.0,
    setup_s: float = 0.3,
    clock_hz: float = 200.0,
    marker_readings: bool = True,
    cache_mib: float = 0.0,
    seed: int = 0,
) -> tuple[list[float], list[float], list[tuple[float, int]]]:
    """(times, bytes, markers) of a loop of `steps` unpaced steps as a trial reads it.

    The script imports for `setup_s` (80 -> 120 MiB), then each step prints its marker,
    converts a column (`temp_mib` held for the middle 80 % of the step, then freed) and
    keeps `leak_mib`; `cache_mib` fills over the first five steps. Readings: the clock at
    `clock_hz` and, with `marker_readings`, one 0.2 ms after each marker. Noise: 0.5 MiB.
    """
    rng = np.random.default_rng(seed)
    first = setup_s
    marks = [(first + i * step_s, i + 1) for i in range(steps)]
    end = first + steps * step_s

    def memory(t: float) -> float:
        if t < first:
            return (80 + 40 * t / first) * MIB
        k = min(int((t - first) // step_s), steps - 1)
        into = (t - first) - k * step_s
        temp = temp_mib if 0.1 * step_s <= into <= 0.9 * step_s else 0.0
        cache = cache_mib * min(k + 1, 5) / 5
        return (120 + leak_mib * k + temp + cache + rng.normal(0, 0.5)) * MIB

    times = list(np.arange(0.0, end + 0.05, 1.0 / clock_hz))
    if marker_readings:
        times += [t + 0.0002 for t, _ in marks]
    times.sort()
    return times, [memory(t) for t in times], marks


def judge(t, v, marks) -> tuple[Verdict, str]:
    run = classify_run(t, v, None, marks, exit_code=0, oom_killed=False, timed_out=False)
    return run.verdict, run.reason


@pytest.mark.parametrize(("leak", "expected"), [(1.0, Verdict.LEAK), (0.0, Verdict.CLEAN)])
def test_an_unpaced_loop_is_judged_per_step(leak: float, expected: Verdict) -> None:
    """A 0.3 s loop of 50 steps: every step has its reading, and its floor."""
    t, v, marks = unpaced(leak_mib=leak)
    verdict, reason = judge(t, v, marks)
    assert verdict is expected, reason
    assert "MiB/step" in reason


def test_the_old_clock_alone_could_not_judge_it() -> None:
    """The same loop read only at 50 Hz (the old fast start, no marker readings): too few."""
    t, v, marks = unpaced(leak_mib=1.0, clock_hz=50.0, marker_readings=False)
    verdict, reason = judge(t, v, marks)
    assert verdict is Verdict.INCONCLUSIVE
    assert reason.startswith("host inconclusive: too few readings to judge alone: ")


def _flat_marked(markers: int) -> tuple[list[float], list[float], list[tuple[float, int]]]:
    """One reading per step (its marker's), 0.5 MiB of noise, the script exits after."""
    rng = np.random.default_rng(markers)
    marks = [(1.0 + 0.01 * i, i + 1) for i in range(markers)]
    t = [0.5] + [m + 0.001 for m, _ in marks] + [marks[-1][0] + 0.005]
    v = [(100 + rng.normal(0, 0.5)) * MIB for _ in t]
    return t, v, marks


def test_21_markers_are_always_enough() -> None:
    assert enough_markers() == 21
    t, v, marks = _flat_marked(21)
    verdict, reason = judge(t, v, marks)
    assert verdict is Verdict.CLEAN, reason
    assert "over 18 steps" in reason


def test_20_markers_are_too_few_and_it_says_so_in_steps() -> None:
    t, v, marks = _flat_marked(20)
    verdict, reason = judge(t, v, marks)
    assert verdict is Verdict.INCONCLUSIVE
    assert reason == (
        "host inconclusive: too few readings to judge alone: 17 over 17 judged steps, "
        "need at least 18 (3 in each of 6 blocks)"
    )


def spike_workload(
    *, leak: bool, seconds: float = 8.0, hz: float = 50.0, spike_s: float = 1.2
) -> tuple[np.ndarray, np.ndarray]:
    """The spike workload on a loaded machine, no markers: a step every 0.2 s keeping
    3 MB (when `leak`), and every 10th step a 200 MB buffer touched page by page for
    `spike_s` (the load stretches it), then freed."""
    rng = np.random.default_rng(1)
    t = np.arange(0.0, seconds, 1.0 / hz)
    base = 100 + (3 * 0.954 * np.floor(t / 0.2) if leak else 0.0)
    into = np.mod(t, 2.0)  # a spike starts every 10 steps (2 s)
    spike = np.where(into < spike_s, 200 * 0.954 * np.minimum(into / 0.3, 1.0), 0.0)
    spike[t < 2.0] = 0.0  # the first comes at 2 s
    return t, (base + spike + rng.normal(0, 0.5, len(t))) * MIB


def test_a_spike_longer_than_a_block_is_never_a_floor() -> None:
    """The floors of the issue's run read 317, 339, 339 MiB inside the spike; left out as
    an excursion, every floor lies on the leak's line."""
    t, v = spike_workload(leak=True, spike_s=1.2)
    part = judged_part(t, v / MIB, (), S)
    assert part is not None
    mask = excursions(part.x, part.v, S)
    assert mask.sum() > 100
    # Every sample flagged stands high above the leak's line (3 MB a step), none below.
    line = 100 + 3 * 0.954 * np.floor(part.x / 0.2)
    assert (part.v[mask] - line[mask] > 8).all()
    _, floors, _ = block_floors(part.x, part.v, 11, 3, 10.0, ~mask)
    assert np.all(np.diff(floors) > 0), floors  # without the spikes the floors only rise


@pytest.mark.parametrize(("leak", "expected"), [(True, Verdict.LEAK), (False, Verdict.CLEAN)])
@pytest.mark.parametrize("spike_s", [0.3, 0.8, 1.2, 1.6])
def test_the_spike_workload_under_load(leak: bool, expected: Verdict, spike_s: float) -> None:
    t, v = spike_workload(leak=leak, spike_s=spike_s)
    a = classify_series(t, v, ended=True)
    assert a.verdict is expected, a.reason


def test_the_exit_of_a_run_without_markers_is_not_judged() -> None:
    """A real run of the spike workload under a CPU hog (tests/traces says which): its last
    readings, 158 MiB then 98, 69 and 14 as the interpreter freed what it held, were its
    last block's floor, and made the plateau before them look like an excursion. Left out,
    the run is the leak it is, and its floors never fall."""
    trace = json.loads((TRACES / "spike_exit_under_load.json").read_text())
    t, v = trace["t"], trace["rss"]
    assert [int(x // MIB) for x in v[-4:]] == [158, 98, 69, 14]
    a = classify_run(t, v, None, exit_code=0, oom_killed=False, timed_out=False)
    assert a.verdict is Verdict.LEAK, a.reason
    floors = list(a.host.floors_mib)
    assert floors == sorted(floors), floors
    # Killed (a timeout, the memory cap), the same readings are no exit: all are judged.
    killed = judged_part(np.array(t), np.array(v) / MIB, (), S, ended=False)
    assert killed is not None and killed.v[-1] == v[-1] / MIB


def test_a_spike_the_warm_up_cut_into_is_an_excursion() -> None:
    """A real 1 s-a-step run without markers (tests/traces says which): the judged part
    opens inside a 32 MiB spike, with no level before it. Its opening stretch is an
    excursion, so the leak's floors (19 to 33 MiB) are what is judged."""
    trace = json.loads((TRACES / "spike_cut_by_warmup.json").read_text())
    t, v = trace["t"], trace["rss"]
    a = classify_run(t, v, None, exit_code=0, oom_killed=False, timed_out=False)
    assert a.verdict is Verdict.LEAK, a.reason
    floors = list(a.host.floors_mib)
    assert floors == sorted(floors) and floors[0] < 25, floors


def test_an_opening_spike_is_left_out_but_a_leak_from_the_start_is_not() -> None:
    x = np.arange(60, dtype=float)
    spike_then_flat = np.where(x < 8, 50.0, 20.0)
    assert excursions(x, spike_then_flat, S)[:8].all()
    assert not excursions(x, spike_then_flat, S)[8:].any()
    rising = 20.0 + x
    assert not excursions(x, rising, S).any()


@pytest.mark.parametrize(
    ("tail", "kept"),
    [
        ([100, 100, 60, 20], [100, 100]),  # the exit: each reading below the one before
        ([100, 100, 60, 60], [100, 100, 60, 60]),  # a level held is no exit
        ([100, 100, 101], [100, 100, 101]),  # still rising at the end
    ],
)
def test_the_exit_is_the_falling_end_only(tail: list[float], kept: list[float]) -> None:
    t = np.arange(40 + len(tail)) * 0.05
    v = np.array([100.0] * 40 + tail)
    part = judged_part(t, v, (), S, ended=True)
    assert part is not None
    assert list(part.v[-len(kept) :]) == kept
    assert part.x[-1] == t[40 + len(kept) - 1]  # nothing after the last reading kept


def test_a_slow_fall_at_the_end_loses_its_last_second_only() -> None:
    """A fall that lasts longer than an exit (a cache trimmed over 3 s) is judged but for
    the readings of its last second."""
    t = np.arange(200) * 0.05  # 10 s at 20 Hz
    v = np.where(t < 7.0, 100.0, 100.0 - (t - 7.0) * 10)
    part = judged_part(t, v, (), S, ended=True)
    assert part is not None
    assert part.x[-1] == pytest.approx(t[-1] - 1.0, abs=0.06)


def _run(verdict: Verdict, analysis: dict) -> PooledRun:
    return PooledRun(verdict, analysis, ended_normally=True)


def _short_runs(n: int, leak: float, cache: float = 0.0) -> list[PooledRun]:
    """`n` runs of a 12-step loop read at its markers and 50 times a second: about 12
    readings over 9 judged steps, each run too short to judge alone."""
    runs = []
    for seed in range(n):
        t, v, marks = unpaced(steps=12, leak_mib=leak, cache_mib=cache, seed=seed, clock_hz=50)
        a = classify_run(t, v, None, marks, exit_code=0, oom_killed=False, timed_out=False)
        assert a.verdict is Verdict.INCONCLUSIVE
        assert "to judge alone: " in a.reason
        runs.append(_run(a.verdict, a.to_dict()))
    return runs


def test_three_short_runs_of_a_leak_pool_to_leak() -> None:
    pooled = classify_runs(_short_runs(3, leak=2.0))
    assert pooled.verdict is Verdict.LEAK, pooled.reason
    assert pooled.reason.startswith("pooled over 3 runs too short to judge alone: leak: ")
    assert pooled.runs == 3


def test_two_short_runs_may_clear_but_not_convict() -> None:
    assert classify_runs(_short_runs(2, leak=0.0)).verdict is Verdict.CLEAN
    two = classify_runs(_short_runs(2, leak=2.0))
    assert two.verdict is Verdict.INCONCLUSIVE, two.reason
    assert two.reason.endswith("two runs cannot tell their spread, a third decides"), two.reason


def test_short_runs_without_markers_are_not_pooled() -> None:
    """A run without markers too short to judge alone lasts a fraction of a second: its
    window would clear anything, so such runs keep their vote (inconclusive)."""
    runs = []
    for seed in range(3):
        t, v, _ = unpaced(steps=12, leak_mib=2.0, seed=seed, setup_s=0.05, clock_hz=50.0)
        a = classify_run(t, v, None, (), exit_code=0, oom_killed=False, timed_out=False)
        assert a.verdict is Verdict.INCONCLUSIVE
        assert "to judge alone: " in a.reason, a.reason
        runs.append(_run(a.verdict, a.to_dict()))
    pooled = classify_runs(runs)
    assert (pooled.verdict, pooled.runs) == (Verdict.INCONCLUSIVE, 0), pooled.reason
    assert pooled.reason == "inconclusive by vote of 3 runs"


def test_a_cache_filling_in_each_short_run_is_not_a_leak() -> None:
    """Each run fills a 40 MiB cache over its first five steps, then stays flat."""
    pooled = classify_runs(_short_runs(3, leak=0.0, cache=40.0))
    assert pooled.verdict is not Verdict.LEAK, pooled.reason


def test_readings_that_bunch_up_are_blocked_in_equal_shares_of_whole_steps() -> None:
    """A loaded runner read a fast loop's steps 3 to 10 three times each, then fell behind
    and read only every third step (a burst's last): no cut into equal widths of steps has
    six blocks of three readings, so the blocks take an equal share of the readings each,
    never splitting a step between two."""
    rng = np.random.default_rng(5)
    read = [(k, r) for k in range(1, 11) for r in range(3)] + [(k, 0) for k in range(11, 51, 3)]
    marks = [(0.5 + 0.006 * k, k) for k in range(1, 51)]
    t = [0.5 + 0.006 * k + 0.001 * (r + 1) for k, r in read]
    v = [(120 + 1.0 * k + rng.normal(0, 0.3)) * MIB for k, _ in read]
    a = classify_series(t, v, marks, ended=True)
    assert a.verdict is Verdict.LEAK, a.reason
    assert len(set(a.floor_x)) == len(a.floor_x) >= 6  # no step's readings in two blocks
    # Cut into equal widths alone, it was too few (the run's verdict before this rule).
    x = np.array([float(k) for k, _ in read if k >= 3])
    y = np.array([v[i] / MIB for i, (k, _) in enumerate(read) if k >= 3])
    for n_blocks in range(6, 13):
        assert len(block_floors(x, y, n_blocks, 3, 10.0)[1]) < 6
