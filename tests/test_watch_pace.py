"""The sample rate keeps pace with the run (runners/watch.py `Pace`): its rules on a given
clock, then a real unpaced run in which every step gets its reading."""

from __future__ import annotations

import os
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from runners.executor import run_script
from runners.watch import CLOCK, FAST_S, MARKER_BUDGET, MARKER_BURST, MARKER_HZ, Lines, Pace


def test_the_clock_is_fastest_while_the_run_is_young() -> None:
    p = Pace(10.0, began=100.0, now=100.0)
    assert p.due(100.0)
    assert p.clock_period(100.5) == pytest.approx(1 / CLOCK[0][1])  # 100 Hz: age < 2 s
    assert p.clock_period(105.0) == pytest.approx(1 / CLOCK[1][1])  # 50 Hz: age < 30 s
    assert p.clock_period(100.0 + FAST_S) == pytest.approx(0.1)  # the job's rate after
    # Never slower than the job asks: at 500 Hz the young run is read at 500 Hz too.
    assert Pace(500.0, began=0.0, now=0.0).clock_period(1.0) == pytest.approx(1 / 500)


def test_the_first_marker_makes_the_run_young_again() -> None:
    """A long set-up must not use up the fast start before the loop begins."""
    p = Pace(10.0, began=0.0, now=0.0)
    assert p.clock_period(40.0) == pytest.approx(0.1)
    p.next_at = 40.05  # as the slow clock had it
    p.first_marker(40.0)
    assert p.clock_period(40.5) == pytest.approx(1 / CLOCK[0][1])
    assert p.next_at == pytest.approx(40.0 + 1 / CLOCK[0][1])  # the next reading comes soon
    p.first_marker(41.0)  # only the first marker counts
    assert p.loop == 40.0


def test_markers_are_read_up_to_marker_hz_while_young_then_at_the_clock() -> None:
    p = Pace(10.0, began=0.0, now=0.0)
    p.first_marker(1.0)
    # A burst (markers that reached the reader together): each is read, up to the bucket.
    for _ in range(MARKER_BURST):
        assert p.marker_due(1.0)
        p.taken(1.0, by_clock=False)
    assert not p.marker_due(1.0)
    assert not p.marker_due(1.0 + 0.5 / MARKER_HZ)
    assert p.marker_due(1.0 + 1.01 / MARKER_HZ)  # then MARKER_HZ a second
    # Old: no closer than the clock's period.
    old = 1.0 + FAST_S + 1.0
    p.taken(old, by_clock=False)
    assert not p.marker_due(old + 0.05)
    assert p.marker_due(old + 0.1)


def test_the_marker_budget_bounds_a_loop_of_tiny_steps() -> None:
    p = Pace(10.0, began=0.0, now=0.0)
    p.first_marker(0.0)
    now = 0.0
    for _ in range(MARKER_BUDGET):
        now += 1.01 / MARKER_HZ
        assert p.marker_due(now)
        p.taken(now, by_clock=False)
    assert not p.marker_due(now + 1.01 / MARKER_HZ)  # the budget is spent: the clock's gap
    assert p.marker_due(now + p.clock_period(now))


def test_a_clock_that_fell_behind_does_not_burst() -> None:
    p = Pace(10.0, began=0.0, now=0.0)
    p.taken(0.0, by_clock=True)
    p.taken(50.0, by_clock=True)  # suspended for 50 s
    assert p.next_at == pytest.approx(50.1)


def test_the_reader_knows_when_it_is_behind() -> None:
    """Lines that came together: the first is not the script's latest; then the pipe's own
    unread bytes say the same."""
    r, w = os.pipe()
    try:
        lines = Lines.of_pipe(r)
        os.write(w, b"::leakbisect-step::\n::leakbisect-step::\n")
        assert lines.readline() == b"::leakbisect-step::\n"
        assert lines.behind()
        assert lines.readline() == b"::leakbisect-step::\n"
        assert not lines.behind()
        os.write(w, b"tail")
        assert lines.behind()  # bytes in the pipe the reader has not taken
        os.close(w)
        w = -1
        assert (lines.readline(), lines.readline()) == (b"tail", b"")
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


UNPACED = textwrap.dedent(
    """
    import time
    kept = []
    for i in range(50):
        print("::leakbisect-step::", flush=True)
        t = time.perf_counter()
        while time.perf_counter() - t < 0.005:  # 5 ms of work, no pause
            pass
        kept.append(bytearray(b"\\xa5") * (1 << 20))
    # A pause before exiting: on a loaded machine the runner reads the last markers late,
    # and a marker read after the script is gone has nothing left to read.
    time.sleep(0.5)
    """
)


def test_every_step_of_an_unpaced_loop_has_its_reading(tmp_path: Path) -> None:
    """50 steps of 5 ms (a 0.25 s loop): a 10 Hz clock alone would read two of them. Every
    step is read, but for one whose marker reached the runner together with the next (the
    runner fell behind on a loaded machine): that step's memory is no longer there to read."""
    script = tmp_path / "unpaced.py"
    script.write_text(UNPACED)
    ex = run_script(sys.executable, script, cwd=tmp_path, timeout_s=60,
                    memory_limit_bytes=1 << 30, run_as=None)  # fmt: skip
    assert ex.exit_code == 0
    assert [s for _, s in ex.steps] == list(range(1, 51))
    per_step = Counter(s.step for s in ex.samples if s.step is not None)
    read_at = dict((step, t) for t, step in ex.steps)
    unread = [k for k in range(1, 51) if k not in per_step]
    together = [k for k in unread if k < 50 and read_at[k + 1] - read_at[k] < 0.001]
    assert unread == together, (unread, [(k, read_at.get(k + 1, 0) - read_at[k]) for k in unread])
    assert len(per_step) >= 25, per_step  # bursts are the exception, even under load
    # Readings are taken one at a time: their times never decrease; none is labelled with
    # a step whose marker had not been read.
    times = [s.t for s in ex.samples]
    assert times == sorted(times)
    assert all(s.t >= read_at[s.step] for s in ex.samples if s.step is not None)
