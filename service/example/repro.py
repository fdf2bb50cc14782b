"""The bundled example repro: 40 steps of `leakyfixture.step()`.

After every step it prints the step marker `::leakbisect-step::` on a line of its own
(flushed), the one-line protocol the runner uses to count steps. A short sleep per
step lets a 10 Hz sampler see the curve; the whole run takes about 2 seconds.

It honours `LEAKBISECT_STEPS` (the script contract's longer-run hint: a candidate that
stayed inconclusive is run again with twice the steps); anything but a positive whole
number there is ignored.
"""

import os
import sys
import time

import leakyfixture

STEPS = 40
STEP_MARKER = "::leakbisect-step::"


def main(steps: int = STEPS, pause: float = 0.05) -> int:
    for _ in range(steps):
        leakyfixture.step()
        print(STEP_MARKER, flush=True)
        time.sleep(pause)
    return 0


def steps_from_env(default: int = STEPS) -> int:
    text = os.environ.get("LEAKBISECT_STEPS", "")
    return int(text) if text.isdigit() and int(text) > 0 else default


if __name__ == "__main__":
    sys.exit(main(steps_from_env()))
