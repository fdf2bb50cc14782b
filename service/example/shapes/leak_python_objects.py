"""Leak behind a heavy import: Python objects kept every step.

numpy and scipy are imported and 200 MiB allocated over about 1.5 s before the first
marker; then every step appends a record of 5,000 small dicts and strings (about
1.7 MiB) to a history that is never trimmed.
"""

import time

import numpy as np
import scipy.linalg  # noqa: F401 - the framework's import
import scipy.stats  # noqa: F401

MARKER = "::leakbisect-step::"
RAMP_MIB, RAMP_S, STEPS = 200, 1.5, 40

weights = []  # the framework's set-up: allocated and written before the first marker
for _ in range(RAMP_MIB // 8):
    weights.append(np.ones(8 * 2**20 // 8))
    time.sleep(RAMP_S / (RAMP_MIB // 8))

history = []
for step in range(STEPS):
    print(MARKER, flush=True)
    history.append([{"step": step, "i": i, "tag": f"s{step}-{i}" * 8} for i in range(5000)])
    time.sleep(0.05)
