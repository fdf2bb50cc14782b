"""Leak behind a heavy import: native memory malloc'd through ctypes and never freed.

numpy and scipy are imported and 200 MiB allocated over about 1.5 s before the first
marker; then every step mallocs 1.5 MiB in C (libc through ctypes), writes it, and
never frees it: no Python allocator sees it.
"""

import ctypes
import time

import numpy as np
import scipy.linalg  # noqa: F401 - the framework's import
import scipy.stats  # noqa: F401

LEAK = 3 * 2**19  # 1.5 MiB
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

MARKER = "::leakbisect-step::"
RAMP_MIB, RAMP_S, STEPS = 200, 1.5, 40

weights = []  # the framework's set-up: allocated and written before the first marker
for _ in range(RAMP_MIB // 8):
    weights.append(np.ones(8 * 2**20 // 8))
    time.sleep(RAMP_S / (RAMP_MIB // 8))

for _ in range(STEPS):
    print(MARKER, flush=True)
    libc.memset(libc.malloc(LEAK), 0xA5, LEAK)  # written, never freed
    time.sleep(0.05)
