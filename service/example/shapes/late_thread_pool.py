"""Bounded: a thread pool that starts late.

From step 12 a ThreadPoolExecutor of 4 workers does numpy work every step (matrix
products whose temporaries are freed), each worker with its own 6 MiB
workspace kept in thread-local storage. Starting the threads costs memory once (stacks,
a glibc malloc arena per thread, the workspaces); after that nothing grows.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.linalg  # noqa: F401 - the framework's import
import scipy.stats  # noqa: F401

MARKER = "::leakbisect-step::"
STEPS, POOL_FROM, WORKERS, WORKSPACE_MIB = 40, 12, 4, 6
local = threading.local()


def work(seed: int) -> float:
    if not hasattr(local, "workspace"):
        local.workspace = np.ones(WORKSPACE_MIB * 2**20 // 8)  # once per thread
    a = np.random.default_rng(seed).standard_normal((192, 192))
    local.workspace[: a.size] = a.ravel()
    return float(np.linalg.norm(a @ a.T))


pool = None
for step in range(STEPS):
    print(MARKER, flush=True)
    if step == POOL_FROM:
        pool = ThreadPoolExecutor(max_workers=WORKERS)
    if pool is not None:
        sum(pool.map(work, range(step, step + WORKERS)))
    time.sleep(0.05)
