"""Bounded: a model loaded after the first step marker.

The script marks its first steps before the model is ready (data loading, say) and
loads 3 shards of 60 MiB at steps 3, 4 and 5; the remaining steps run inference
with temporaries only. Memory jumps by 180 MiB once and then is flat.
"""

import time

import numpy as np
import scipy.linalg  # noqa: F401 - the framework's import
import scipy.stats  # noqa: F401

MARKER = "::leakbisect-step::"
STEPS, SHARD_MIB = 40, 60

shards: list[np.ndarray] = []
rng = np.random.default_rng(0)
for step in range(STEPS):
    print(MARKER, flush=True)
    if step in (3, 4, 5):
        shards.append(rng.standard_normal(SHARD_MIB * 2**20 // 8))  # written: resident
    if shards:
        float(shards[-1][:65536] @ shards[0][:65536])
    time.sleep(0.05)
