"""Repro for ckptfixture: save a small tree of arrays 30 times, a marker each.

The shape of the mission's orbax report: a CheckpointManager saving a pytree every step.
Importing ckptfixture takes seconds and a few hundred MiB, all before the first marker.
Honours LEAKBISECT_STEPS (a positive whole number).
"""

import os
import tempfile
import time

import ckptfixture
import numpy as np

text = os.environ.get("LEAKBISECT_STEPS", "")
steps = int(text) if text.isdigit() and int(text) > 0 else 30
tree = {"params": np.ones((512, 512)), "opt_state": np.zeros((512, 512))}  # 4 MiB
with tempfile.TemporaryDirectory() as directory:
    manager = ckptfixture.CheckpointManager(directory)
    for step in range(steps):
        print("::leakbisect-step::", flush=True)
        tree["params"] += 1.0
        manager.save(step, tree)
        time.sleep(0.03)
