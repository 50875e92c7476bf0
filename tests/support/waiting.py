"""Waiting for an effect that happens on another thread or process, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """True as soon as ``predicate()`` is; False once ``timeout_s`` passed without it."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
