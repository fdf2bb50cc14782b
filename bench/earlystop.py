"""Early stopping's wall time on a generated repro with a 10-minute run (full bench only).

The repro (`LONG_REPRO`, written by the bench) keeps 0.25 MiB every 0.5 s for
`LONG_S` seconds: a leak of 30 MiB/min on a ~10 MiB interpreter, stdlib only. It runs
under `runners.executor.run_script` twice: to its end without early stopping (as the
good bound of a job does first with --jobs 1), then with the early-stop settings the
service would send once that run is the job's horizon (`service.specs.early_stop` on
a default job). The figures are the script's wall time and how each run ended.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from runners.executor import run_script
from runners.wire import EarlyStop
from service.specs import look_every

LONG_S = 600.0
LONG_REPRO = f"""\
import time
keep = []
t0 = time.monotonic()
while time.monotonic() - t0 < {LONG_S}:
    keep.append(b"x" * (256 * 1024))  # touched pages: resident
    time.sleep(0.5)
"""


def long_run(work: Path, early: EarlyStop | None) -> dict[str, Any]:
    """One 10-minute repro run under the sampler; early: its early-stop settings or None."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "long_repro.py"
    script.write_text(LONG_REPRO)
    started = time.monotonic()
    ex = run_script(sys.executable, script, cwd=work, timeout_s=LONG_S + 300,
                    memory_limit_bytes=None, early_stop=early, run_as=None)  # fmt: skip
    return {
        "how": "with early stopping" if early is not None else "without (--no-early-stop)",
        "early_stop": early is not None,
        "wall_s": time.monotonic() - started,
        "duration_s": ex.duration_s,
        "exit_code": ex.exit_code,
        "stopped_early": ex.stopped_early,
        "samples": len(ex.samples),
    }


def settings_for(horizon_s: float) -> EarlyStop:
    """What the service sends a trial of a default job whose longest full run took horizon_s."""
    return EarlyStop(horizon_s=horizon_s, look_every_s=look_every(horizon_s))


if __name__ == "__main__":  # one mode, for a measurement by hand: `python -m bench.earlystop on`
    import json

    mode = sys.argv[1]
    res = long_run(Path(sys.argv[2]), settings_for(LONG_S) if mode == "on" else None)
    print(json.dumps(res))


def run_long(work: Path, log: Any) -> list[dict[str, Any]]:
    """Without early stopping to the end (the horizon), then with it."""
    log(f"e2e: generated {LONG_S:.0f} s repro, without early stopping")
    off = long_run(work / "off", None)
    log(f"e2e: generated {LONG_S:.0f} s repro, with early stopping")
    on = long_run(work / "on", settings_for(off["duration_s"]))
    return [off, on]
