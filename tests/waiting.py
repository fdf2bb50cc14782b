"""Waiting for something another thread or process does, in tests (no fixed sleeps)."""

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> Any:
    """`check()`'s first true value, polled every `interval` s; fails saying `what` after
    `timeout` s, and what `explain()` says of the state then (the thing a failure under
    load needs to be understood from its log alone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    state = f"; {explain()}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{state}")
