"""Bounded: compile caches that fill over the first steps, then stop.

Each of the first 12 steps compiles 250 new generated functions into a dict (a JIT's
code cache), compiles 300 new regular expressions, and fills an lru_cache(maxsize=3000)
of numpy results; later steps hit those caches only. Memory rises by tens of MiB over
the warm-up steps and then stays.
"""

import functools
import re
import time

import numpy as np
import scipy.signal  # noqa: F401 - the framework's import
import scipy.stats  # noqa: F401

MARKER = "::leakbisect-step::"
STEPS, WARM_STEPS = 40, 12

code_cache: dict[str, object] = {}
patterns: dict[str, re.Pattern[str]] = {}


@functools.lru_cache(maxsize=3000)
def kernel(n: int) -> np.ndarray:
    return np.arange(1024, dtype=np.float64) * n  # 8 KiB a result


def compile_function(name: str) -> object:
    body = "\n".join(f"    x{i} = a * {i} + b - {name!r}.count('{i % 10}')" for i in range(40))
    source = f"def {name}(a, b):\n{body}\n    return x39\n"
    namespace: dict[str, object] = {}
    exec(compile(source, f"<jit {name}>", "exec"), namespace)
    return namespace[name]


for step in range(STEPS):
    print(MARKER, flush=True)
    k = step % WARM_STEPS  # after the warm-up the same names come again: cache hits
    for i in range(250):
        name = f"f_{k}_{i}"
        if name not in code_cache:
            code_cache[name] = compile_function(name)
    for i in range(300):
        text = rf"(?P<k{k}>\d{{{i % 7 + 1}}})[a-z]+{k}_{i}\s*(x|y|z)+"
        patterns.setdefault(text, re.compile(text))
    for i in range(250):
        kernel(k * 250 + i)
    time.sleep(0.05)
