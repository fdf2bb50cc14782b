"""Repro for heavyfixture: build a model, then 30 training-like steps, a marker each.

Importing heavyfixture takes seconds and a few hundred MiB (numpy, scipy, its runtime),
all before the first marker. Honours LEAKBISECT_STEPS (a positive whole number).
"""

import os
import time

import heavyfixture

text = os.environ.get("LEAKBISECT_STEPS", "")
steps = int(text) if text.isdigit() and int(text) > 0 else 30
model = heavyfixture.Model()
for _ in range(steps):
    print("::leakbisect-step::", flush=True)
    model.step()
    time.sleep(0.03)
