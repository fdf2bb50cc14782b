"""Bounded: cyclic garbage that only the generational GC frees, growing then settling.

Each step builds a graph of 6000 objects in reference cycles and keeps the last 8
graphs; an older graph is dropped but, being cyclic and already promoted to the oldest
generation, waits for a full collection, which CPython runs only once the garbage
reaches a quarter of the long-lived objects. Memory grows for many steps, is collected,
and the freed memory is reused: a high-water mark, not a leak.
"""

import collections
import time

import numpy as np  # noqa: F401 - the framework's import
import scipy.stats  # noqa: F401

MARKER = "::leakbisect-step::"
STEPS, NODES, KEEP = 40, 6000, 8


class Node:
    __slots__ = ("peer", "payload")

    def __init__(self, i: int) -> None:
        self.peer: Node | None = None
        self.payload = [i, str(i) * 20, {"i": i}]


def graph(n: int) -> list[Node]:
    nodes = [Node(i) for i in range(n)]
    for a, b in zip(nodes, nodes[1:] + nodes[:1], strict=True):
        a.peer = b  # one big cycle: refcounting alone never frees it
    return nodes


recent: collections.deque[list[Node]] = collections.deque(maxlen=KEEP)
for _ in range(STEPS):
    print(MARKER, flush=True)
    recent.append(graph(NODES))
    time.sleep(0.05)
