"""The bundled repro at another pace: `repro_source(ReproSpec(...))` is its text with knobs.

A trial runs the script alone, in an environment where nothing of leakbisect can be
imported (the one thing it is told is `LEAKBISECT_STEPS`, the longer-run hint), so the
knobs are baked into a copy of `repro.py`'s own text. Each changed line must appear in
the bundled script exactly once, so a change there that moves one fails loudly here:

- `steps`: `STEPS = 40`, the number of steps (`LEAKBISECT_STEPS` still overrides it);
- `pause_s`: the pause after each step (`pause: float = 0.05`); 0 is an unpaced loop
  (`time.sleep(0)` only yields the CPU);
- `markers`: False drops the line that prints the step marker, so the run has none;
- `work_mib`: more than 0 adds an ETL loop's work after each `leakyfixture.step()`: a
  column of that many MiB of bytes is made, decoded to text and dropped (`convert`), so
  the memory rises by twice that within the step and falls back before the next.

How long an unpaced 50-step loop lasts with each size is measured by bench/pace.py on
every run (`loop_seconds`, from the first step marker to the last). On the project's
2-core machine (AMD EPYC, nearly idle), five runs each of 1.0.5 and 1.0.6: no work 0.15 to
0.25 s (the fixture's own step: its leak, spikes, cache and churn), 1 MiB 0.24 to 0.29 s,
2 MiB 0.32 to 0.38 s, 20 MiB 1.6 to 1.9 s, 24 MiB 1.9 to 2.4 s, 28 MiB 2.3 to 2.8 s. So
1 MiB and 24 MiB are the two lengths of issue #35's unpaced repros, about 0.3 s and
about 2 s (`WORK_MIB_FOR`).

`ReproSpec()` gives the bundled script unchanged. The spike workload's fixture is
`service.example.fixture.SPIKE_WORKLOAD`; its repro has no markers (`markers=False`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPRO = Path(__file__).with_name("repro.py")
# Unpaced 50-step loop's length (s) -> work per step (MiB) that gives it on the 2-core machine.
WORK_MIB_FOR = {0.3: 1, 2.0: 24}

_STEPS = "STEPS = 40\n"
_PAUSE = "pause: float = 0.05"
_MARKER = "        print(STEP_MARKER, flush=True)\n"
_STEP = "        leakyfixture.step()\n"
_MARKER_CONSTANT = 'STEP_MARKER = "::leakbisect-step::"\n'
_CONVERT = '''WORK_MIB = {work_mib!r}


def convert(mib: int) -> None:
    """One ETL step's work: a column of `mib` MiB of bytes made, decoded to text, dropped."""
    column = bytearray(b"a") * (mib << 20)
    column.decode("ascii")
'''


@dataclass(frozen=True)
class ReproSpec:
    """The bundled repro's knobs; the defaults are the bundled script's own."""

    steps: int = 40
    pause_s: float = 0.05
    markers: bool = True
    work_mib: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, not {self.steps}")
        if not 0 <= self.pause_s <= 60:
            raise ValueError(f"pause_s must be 0 to 60 seconds, not {self.pause_s}")
        if self.work_mib < 0:
            raise ValueError(f"work_mib must be 0 or more, not {self.work_mib}")

    def describe(self) -> str:
        """The knobs in words, e.g. "50 steps, unpaced, markers, 24 MiB of work a step"."""
        pace = f"{self.pause_s:g} s pause a step" if self.pause_s else "unpaced"
        work = f", {self.work_mib} MiB of work a step" if self.work_mib else ""
        marks = "markers" if self.markers else "no markers"
        return f"{self.steps} steps, {pace}, {marks}{work}"


def _swap(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"{REPRO.name} no longer has {old.strip()!r} exactly once")
    return text.replace(old, new)


def repro_source(spec: ReproSpec) -> str:
    """The bundled `repro.py` with `spec`'s knobs baked in (the module docstring says how)."""
    text = REPRO.read_text()
    if spec == ReproSpec():
        return text
    text = _swap(text, _STEPS, f"STEPS = {spec.steps}\n")
    text = _swap(text, _PAUSE, f"pause: float = {spec.pause_s!r}")
    if not spec.markers:
        text = _swap(text, _MARKER, "")
    if spec.work_mib:
        convert = _CONVERT.format(work_mib=spec.work_mib)
        text = _swap(text, _MARKER_CONSTANT, f"{_MARKER_CONSTANT}{convert}")
        text = _swap(text, _STEP, f"{_STEP}        convert(WORK_MIB)\n")
    return f"# {spec.describe()}: service.example.paced's copy of the bundled repro.\n{text}"


def write_repro(path: Path, spec: ReproSpec) -> Path:
    """Write `repro_source(spec)` to `path`; returns `path`."""
    path.write_text(repro_source(spec))
    return path
