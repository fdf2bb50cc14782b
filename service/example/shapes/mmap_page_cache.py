"""Bounded: a memory-mapped file, touched in a first pass, then read again.

Set-up writes a 96 MiB file. The first 10 steps map it with np.memmap and read one
tenth each, so the mapped pages (in the page cache, counted in RSS as file pages) join
the process; the other 30 steps read the whole file again: the same pages, no growth.
"""

import os
import time

import numpy as np
import scipy.stats  # noqa: F401 - the framework's import

MARKER = "::leakbisect-step::"
STEPS, PASS_STEPS, FILE_MIB = 40, 10, 96
path = "mapped.bin"
np.arange(FILE_MIB * 2**20 // 8, dtype=np.float64).tofile(path)

data = np.memmap(path, dtype=np.float64, mode="r")
part = len(data) // PASS_STEPS
for step in range(STEPS):
    print(MARKER, flush=True)
    if step < PASS_STEPS:
        float(data[step * part : (step + 1) * part].sum())  # first pass: pages mapped in
    else:
        float(data.sum())  # the same pages again
    time.sleep(0.05)
del data
os.remove(path)
