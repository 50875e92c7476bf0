"""A tier's health: keys whose load failed, load deadlines, and the slow-tier back-off.

* **Negative cache.** A load that fails (missing record, failed check, I/O error, abandoned at
  its deadline) keeps its key out of lookups for ``negative_ttl_s`` whatever the cause, so no
  request re-promotes a bad block forever (the livelock of vLLM issue 49176); the store drops
  a bad record itself. A good store of the key lifts it at once (a fresh copy is
  authoritative).
* **Deadlines.** Every load job gets one: its ticket's from the restore policy (one rule,
  ``kvtier.policy.load_tickets``), or a caller's own rule (tests), on the tier's clock.
* **Slow back-off.** A job that overran its deadline marks the tier slow: lookups miss for
  ``SLOW_BACKOFF_S``, doubling (up to 16x) while the tier keeps overrunning, back to the base
  once a load completes.

Every method may be called from any thread. The lookup checks (``recently_failed``,
``is_slow``) take no lock while nothing failed, the scheduler's common case. Knows nothing of
vLLM.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

#: How long a key whose load failed stays a miss (unless a good copy is stored first).
NEGATIVE_TTL_S = 300.0
#: How long a tier that overran a deadline is skipped by lookups (doubles, up to 16x).
SLOW_BACKOFF_S = 5.0
#: Most a back-off doubles to, in multiples of ``SLOW_BACKOFF_S``.
SLOW_BACKOFF_MAX_FACTOR = 16


class TierHealth:
    """Negative cache, load deadlines and slow back-off of one tier (module docstring)."""

    def __init__(
        self,
        clock: Callable[[], float],
        negative_ttl_s: float = NEGATIVE_TTL_S,
        load_deadline_s: Callable[[int], float] | None = None,
    ) -> None:
        """``load_deadline_s(nbytes)``: seconds a load job of ``nbytes`` may take, instead of
        the policy's (tests)."""
        self._clock = clock
        self._negative_ttl_s = negative_ttl_s
        self._explicit_deadline = load_deadline_s
        self._lock = threading.Lock()
        self._failed_until: dict[bytes, float] = {}
        self._slow_until = 0.0
        self._backoff_s = SLOW_BACKOFF_S

    # -- negative cache ------------------------------------------------------------------
    def load_failed(self, keys: Iterable[bytes]) -> None:
        """These keys' loads failed: they miss for ``negative_ttl_s``."""
        until = self._clock() + self._negative_ttl_s
        with self._lock:
            for key in keys:
                self._failed_until[key] = until

    def stored(self, key: bytes) -> None:
        """A good copy of ``key`` was stored: it may be served again at once."""
        if self._failed_until:  # unlocked peek: nothing to lift in the common case
            with self._lock:
                self._failed_until.pop(key, None)

    def recently_failed(self, key: bytes) -> bool:
        """True while ``key``'s negative entry lasts (an expired entry is dropped)."""
        if not self._failed_until:
            return False
        with self._lock:
            until = self._failed_until.get(key)
            if until is None:
                return False
            if until > self._clock():
                return True
            del self._failed_until[key]
            return False

    # -- deadlines and back-off ----------------------------------------------------------
    def deadline(self, nbytes: int, policy_deadline_s: float) -> float:
        """When a load job of ``nbytes`` starting now must have finished (tier clock): the
        caller's rule if one was given (tests), else ``policy_deadline_s`` (the load's ticket:
        ``kvtier.policy.load_tickets``) seconds from now."""
        if self._explicit_deadline is not None:
            return self._clock() + self._explicit_deadline(nbytes)
        return self._clock() + policy_deadline_s

    def is_slow(self) -> bool:
        """True while the tier is skipped after an overrun deadline."""
        return bool(self._slow_until) and self._slow_until > self._clock()

    def overran(self, unfinished: Iterable[bytes]) -> float:
        """A load job overran its deadline: skip the tier for the current back-off (returned,
        in seconds; the next one doubles) and keep its ``unfinished`` keys out of lookups."""
        self.load_failed(unfinished)
        with self._lock:
            backoff = self._backoff_s
            self._slow_until = self._clock() + backoff
            self._backoff_s = min(backoff * 2, SLOW_BACKOFF_S * SLOW_BACKOFF_MAX_FACTOR)
        return backoff

    def load_completed(self) -> None:
        """A load finished in time: the next overrun starts from the base back-off."""
        if self._slow_until:
            with self._lock:
                self._backoff_s = SLOW_BACKOFF_S
