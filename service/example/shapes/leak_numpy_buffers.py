"""Leak behind a heavy import: numpy buffers kept every step.

numpy and scipy are imported and 200 MiB allocated over about 1.5 s before the first
marker; then every step keeps a 1.5 MiB activation buffer in a list nobody clears (the
classic "store the loss tensor, not its value" leak).
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

kept = []
x = np.random.default_rng(0).standard_normal((256, 256))
for _ in range(STEPS):
    print(MARKER, flush=True)
    activation = np.tanh(x @ x.T)  # 512 KiB
    kept.append(np.concatenate([activation, activation, activation]))  # 1.5 MiB, kept
    time.sleep(0.05)
