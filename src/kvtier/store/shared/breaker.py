"""A circuit breaker per server, so a dead or hung server costs one timeout, not one per op.

States: *closed* (ops go through), *open* (every op is refused without I/O until the back-off
ends), *probing* (the back-off ended: exactly one op goes through as a probe while the others
are still refused). A success closes the breaker and resets the back-off; a failure while
closed opens it for ``base_s``; a failed probe reopens it for twice the last back-off, at most
``max_s``. The clock is injectable so tests step time instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """Thread-safe breaker for one server (see the module docstring for the states)."""

    def __init__(
        self, base_s: float, max_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._base_s = base_s
        self._max_s = max_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open_until: float | None = None  # None: closed
        self._backoff_s = 0.0
        self._probing = False
        #: Times the breaker went from closed to open.
        self.openings = 0
        #: Times a probe succeeded after the breaker had opened (the server is back).
        self.recoveries = 0

    @property
    def is_open(self) -> bool:
        """True while ops are being refused (open, or probing by another op)."""
        with self._lock:
            return self._open_until is not None

    def allow(self) -> bool:
        """May an op go to the server now? A True after the back-off makes this op the probe."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def success(self) -> None:
        """The op reached the server and got a reply (even an error reply)."""
        with self._lock:
            if self._open_until is not None:
                self.recoveries += 1
            self._open_until = None
            self._backoff_s = 0.0
            self._probing = False

    def not_sent(self) -> None:
        """The op let through did not reach the server after all (it could not be sent that
        way): when it was the probe, the next op may probe instead."""
        with self._lock:
            self._probing = False

    def failure(self) -> None:
        """The op failed for want of the server (connection error, timeout)."""
        with self._lock:
            if self._open_until is None:
                self.openings += 1
                self._backoff_s = self._base_s
            elif self._probing:
                self._backoff_s = min(self._backoff_s * 2, self._max_s)
            else:
                return  # an op that started before the breaker opened: already counted
            self._probing = False
            self._open_until = self._clock() + self._backoff_s
