"""The fixture's knobs for pace and load (issue #35): the bundled repro at another pace, with
or without step markers and with work per step (service/example/paced.py), and the spike
workload's noise (`page_spikes`, service/example/fixture.py). Each is run for real: the
generated script by an interpreter with a release's wheel on its path (Python imports a
pure-Python wheel from its zip), its markers read from stdout and its peak RSS from the
kernel (/proc/self/status)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.example import paced
from service.example.fixture import SPIKE_WORKLOAD, FixtureSpec, module_source, write_wheel
from service.example.paced import REPRO, ReproSpec, repro_source, write_repro

MARKER = "::leakbisect-step::"
MIB = 1024 * 1024


def wheel(tmp_path: Path, spec: FixtureSpec, version: str) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir(exist_ok=True)
    return write_wheel(folder, spec, version)


# Runs a script as `python SCRIPT` would, then writes its peak RSS (VmHWM: this process's
# since exec, unlike ru_maxrss, which keeps the forking parent's) to stderr.
PEAK = """\
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    with open("/proc/self/status") as f:
        print(f.read().split("VmHWM:")[1].split()[0], file=sys.stderr)
"""


def run(script: Path, whl: Path, **env: str) -> tuple[list[float], int]:
    """The times its step markers were read, and its peak RSS in bytes."""
    proc = subprocess.Popen([sys.executable, "-c", PEAK, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(whl), **env})  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    marks = [time.monotonic() for line in proc.stdout if line.strip() == MARKER]
    err = proc.stderr.read()
    assert proc.wait() == 0, err
    return marks, int(err.split()[-1]) * 1024


def test_the_default_knobs_are_the_bundled_repro_unchanged() -> None:
    assert repro_source(ReproSpec()) == REPRO.read_text()
    assert ReproSpec().describe() == "40 steps, 0.05 s pause a step, markers"


def test_an_unpaced_copy_prints_a_marker_per_step_and_honours_the_longer_run_hint(
    tmp_path: Path,
) -> None:
    whl = wheel(tmp_path, FixtureSpec(), "1.0.6")
    spec = ReproSpec(steps=50, pause_s=0.0)
    script = write_repro(tmp_path / "repro.py", spec)
    assert script.read_text().splitlines()[0] == (
        "# 50 steps, unpaced, markers: service.example.paced's copy of the bundled repro."
    )
    marks, _ = run(script, whl)
    assert len(marks) == 50
    marks, _ = run(script, whl, LEAKBISECT_STEPS="7")
    assert len(marks) == 7


def test_a_paced_copy_sleeps_its_pause_after_every_step(tmp_path: Path) -> None:
    whl = wheel(tmp_path, FixtureSpec(), "1.0.5")
    marks, _ = run(write_repro(tmp_path / "repro.py", ReproSpec(steps=6, pause_s=0.2)), whl)
    assert len(marks) == 6
    # Each marker comes a step after the previous one's pause: never sooner.
    assert min(b - a for a, b in zip(marks, marks[1:], strict=False)) >= 0.2


def test_a_copy_without_markers_prints_none(tmp_path: Path) -> None:
    whl = wheel(tmp_path, FixtureSpec(), "1.0.6")
    script = write_repro(tmp_path / "repro.py", ReproSpec(steps=20, pause_s=0.0, markers=False))
    assert "print(STEP_MARKER" not in script.read_text()
    marks, _ = run(script, whl)
    assert marks == []


def test_work_per_step_raises_the_peak_by_twice_the_column(tmp_path: Path) -> None:
    """A column of 64 MiB made and decoded to text: both are alive at once, then dropped."""
    whl = wheel(tmp_path, FixtureSpec(noise=()), "1.0.5")  # clean, no noise: flat
    _, plain = run(write_repro(tmp_path / "plain.py", ReproSpec(steps=5, pause_s=0.0)), whl)
    worked = write_repro(tmp_path / "work.py", ReproSpec(steps=5, pause_s=0.0, work_mib=64))
    marks, peak = run(worked, whl)
    assert len(marks) == 5
    assert peak - plain > 2 * 64 * MIB * 0.95, (plain, peak)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"steps": 0}, "steps must be at least 1, not 0"),
        ({"pause_s": -1.0}, "pause_s must be 0 to 60 seconds, not -1.0"),
        ({"work_mib": -2}, "work_mib must be 0 or more, not -2"),
    ],
)
def test_bad_knobs_are_refused(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        ReproSpec(**spec)


def test_a_bundled_repro_that_lost_a_knobs_line_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved = tmp_path / "repro.py"
    moved.write_text(REPRO.read_text().replace("STEPS = 40\n", "STEPS = 41\n"))
    monkeypatch.setattr(paced, "REPRO", moved)
    with pytest.raises(RuntimeError, match=r"^repro.py no longer has 'STEPS = 40' exactly once$"):
        repro_source(ReproSpec(steps=50))


# --- the spike workload's noise ----------------------------------------------------------

SPIKE_PROBE = """\
import resource
import leakyfixture

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def peak():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) * 1024

for _ in range(9):
    leakyfixture.step()
before = rss()
leakyfixture.step()  # the 10th: the 200 MiB buffer, touched page by page, then unmapped
after = rss()
highest = peak()
for _ in range(10):
    leakyfixture.step()
print(before, after, highest, rss())
"""


@pytest.mark.parametrize(("version", "kept_mib"), [("1.0.5", 0), ("1.0.6", 3)])
def test_the_spike_workload_touches_200_mib_every_10th_step_and_keeps_3_mib_a_step_when_leaking(
    tmp_path: Path, version: str, kept_mib: int
) -> None:
    whl = wheel(tmp_path, SPIKE_WORKLOAD, version)
    probe = tmp_path / "probe.py"
    probe.write_text(SPIKE_PROBE)
    out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(whl)}, check=True)  # fmt: skip
    before, after, peak, end = (int(x) for x in out.stdout.split())
    assert peak - before > 195 * MIB  # every page of the buffer was resident at once
    assert after - before < (kept_mib + 2) * MIB  # and it is gone after the step
    assert (kept_mib + 0.5) * 10 * MIB > end - after > (kept_mib - 0.5) * 10 * MIB


def test_page_spikes_are_in_the_spike_workload_only() -> None:
    assert "PAGE_SPIKE" not in module_source(FixtureSpec(), "1.0.6")
    assert "PAGE_SPIKE_BYTES = 209715200" in module_source(SPIKE_WORKLOAD, "1.0.6")
    assert SPIKE_WORKLOAD.leaks("1.0.6") and not SPIKE_WORKLOAD.leaks("1.0.5")
    with pytest.raises(ValueError, match="^unknown noise kinds: pages$"):
        FixtureSpec(noise=("pages",))
    with pytest.raises(ValueError, match="^page_spike_mib and page_spike_every must be at least"):
        FixtureSpec(page_spike_every=0)
