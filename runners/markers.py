"""The step-marker protocol between a repro script and leakbisect.

A repro script may tell leakbisect where its iterations (training steps,
checkpoints, requests...) begin by printing a *step marker* line on stdout::

    ::leakbisect-step::          # "one more step" (the runner counts: 1, 2, 3...)
    ::leakbisect-step:: 42       # "step 42 starts now"

Rules:

* The marker must be at the start of a line on **stdout** (stderr is not
  parsed). Anything after the marker other than an integer is ignored, and
  the line then counts as an unnumbered step.
* An unnumbered marker continues from the last step seen (``last + 1``;
  the first one is step 1).
* Flush after printing (``print(..., flush=True)``), or the marker reaches the
  runner late and the step times are wrong. The runner also sets
  ``PYTHONUNBUFFERED=1`` for the script unless the environment sets it.
* Marker lines are recorded as ``(t, step)`` (seconds since the script
  started) and never appear in the trial's log tail.

The classifier uses the markers to drop warm-up steps and to relate memory to
work done; scripts without markers are judged on time alone.

No dependency on leakbisect is needed in the script: copying the one-line
``print("::leakbisect-step::", flush=True)`` is as good as importing `step`.
"""

from __future__ import annotations

import sys

STEP_MARKER = "::leakbisect-step::"


def step(n: int | None = None) -> None:
    """Print a step marker (numbered when ``n`` is given) and flush stdout."""
    line = STEP_MARKER if n is None else f"{STEP_MARKER} {int(n)}"
    print(line, file=sys.stdout, flush=True)


def parse_marker(line: str) -> tuple[bool, int | None]:
    """(is_marker, step number or None) for one stdout line."""
    if not line.startswith(STEP_MARKER):
        return False, None
    rest = line[len(STEP_MARKER) :].strip()
    if rest:
        try:
            return True, int(rest.split()[0])
        except ValueError:
            pass
    return True, None
