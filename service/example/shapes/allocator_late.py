"""Bounded: an allocator that gives memory back late.

Every 10 steps a batch job builds 300,000 small objects (about 60 MiB from Python's
small-object allocator) and drops them a step later, except one in a hundred, which a
"pending results" list keeps for 2 more steps. Those survivors are spread over every
arena, so no arena is empty and none is returned until they go too: memory stays up
for a few steps after the work is done, then falls back. The same every 10 steps.
"""

import time

import numpy as np  # noqa: F401 - the framework's import
import scipy.stats  # noqa: F401

MARKER = "::leakbisect-step::"
STEPS, EVERY, OBJECTS, HOLD = 40, 10, 300_000, 2

batch: list[tuple[int, str, float]] = []
pending: list[tuple[int, str, float]] = []
for step in range(STEPS):
    print(MARKER, flush=True)
    phase = step % EVERY
    if phase == 2:
        batch = [(i, f"row-{i}", i * 0.5) for i in range(OBJECTS)]
    elif phase == 3:
        pending = batch[::100]
        batch = []  # freed, but the arenas stay: survivors live in every one
    elif phase == 3 + HOLD:
        pending = []  # now the arenas empty and go back to the system
    time.sleep(0.05)
