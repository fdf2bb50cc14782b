"""Bounded: a heavy import ramp, then flat steps.

numpy and scipy are imported, then 300 MiB of "weights" are allocated and written over
about 3 s, all before the first step marker (a framework's import and set-up): more than
half of the run, as with JAX or PyTorch on a short repro. The 40 steps then do numpy
work whose temporaries are freed. Nothing grows after set-up.
"""

import time

import numpy as np
import scipy.linalg
import scipy.signal
import scipy.sparse
import scipy.stats  # noqa: F401 - the import is the point: tens of MiB over a second

MARKER = "::leakbisect-step::"
RAMP_MIB, RAMP_S, STEPS = 300, 3.0, 40

weights = []
for _ in range(RAMP_MIB // 8):
    weights.append(np.ones(8 * 2**20 // 8))  # written: resident
    time.sleep(RAMP_S / (RAMP_MIB // 8))

x = np.random.default_rng(0).standard_normal((256, 256))
for _ in range(STEPS):
    print(MARKER, flush=True)
    y = np.tanh(x @ x.T)  # temporaries, freed when the step ends
    time.sleep(0.05)
