"""Bounded: glibc malloc arenas that grow with the number of threads.

Over the first 16 steps one more worker thread starts every other step, up to 8. Each
worker keeps a rolling window of 120 buffers of 8-96 KiB (malloc'd, touched) and
replaces one at a time, so each thread's arena grows to its working set and stays
there. Memory rises with every thread started, then is flat.
"""

import random
import threading
import time

import numpy as np  # noqa: F401 - the framework's import
import scipy.linalg  # noqa: F401

MARKER = "::leakbisect-step::"
STEPS, THREADS, WINDOW = 40, 8, 120
stop = threading.Event()


def worker(seed: int) -> None:
    rnd = random.Random(seed)
    window = [b""] * WINDOW
    i = 0
    while not stop.is_set():
        for _ in range(40):
            window[i % WINDOW] = bytes([i % 251]) * rnd.randrange(8 << 10, 96 << 10)
            i += 1
        time.sleep(0.01)


threads = []
for step in range(STEPS):
    print(MARKER, flush=True)
    if step % 2 == 0 and len(threads) < THREADS:
        threads.append(threading.Thread(target=worker, args=(step,), daemon=True))
        threads[-1].start()
    time.sleep(0.05)
stop.set()
for t in threads:
    t.join()
