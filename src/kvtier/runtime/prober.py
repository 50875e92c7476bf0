"""Asking a shared server about keys a lookup could not answer from memory.

A store with ``abilities.remote_lookup`` (the shared store) does not know every key it could
load: another replica may have stored it on the server. Its lookups cannot ask the server (the
scheduler thread does no network I/O), so ``ask`` queues the key and answers "asking" (vLLM's
RETRY: it keeps scanning the request's keys and asks again next step), and the prober's own
thread asks the server about every key of one scheduler step in one batch
(``exists_many``, one pipelined round trip per node). The store learns the keys found, so the
next lookup is a plain hit; a key the server does not hold is "absent" for ``ABSENT_TTL_S``
without asking again, then asked anew (another replica may have stored it since). A key may
name the store to ask (a tenant's view, whose names differ: kvtier.store.tenant_view); keys
of one step are asked in one batch per store.

Knows nothing of vLLM: the tier maps "asking" to RETRY and "absent" to MISS.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from kvtier.threads import name_os_thread

#: Asks a store which of the keys it holds (``BlockStore.exists_many``).
ExistsMany = Callable[[Iterable[bytes]], set[bytes]]

logger = logging.getLogger(__name__)

#: How long a key the shared server said it does not hold stays a miss without asking again.
ABSENT_TTL_S = 2.0
#: Most remembered "absent" answers before the expired ones are forgotten.
_ABSENT_MAX = 100_000


class ExistenceProber:
    """Batched existence checks for one store, on a thread of its own (module docstring)."""

    def __init__(
        self,
        exists_many: ExistsMany,
        clock: Callable[[], float],
        *,
        label: str,
        wait_s: float,
        absent_ttl_s: float = ABSENT_TTL_S,
    ) -> None:
        """``exists_many``: the store's, for keys asked about without one; ``wait_s``: how
        often the idle thread looks whether it was stopped."""
        self._exists_many = exists_many
        self._clock = clock
        self._label = label
        self._wait_s = wait_s
        self._absent_ttl_s = absent_ttl_s
        self._lock = threading.Lock()
        # Keys to ask about, keys being asked about, and recent "absent" answers, each with
        # the store asked (one tenant's absent key says nothing of another's).
        self._to_ask: list[tuple[bytes, ExistsMany]] = []
        self._asking: set[tuple[bytes, ExistsMany]] = set()
        self._absent_until: dict[tuple[bytes, ExistsMany], float] = {}
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def ask(self, key: bytes, exists_many: ExistsMany | None = None) -> bool:
        """Scheduler thread, no I/O: True while the server is (or will be) asked about
        ``key`` (through ``exists_many``, default the store's); False when it said recently
        that it does not hold it."""
        asked = (key, exists_many or self._exists_many)
        with self._lock:
            if asked in self._asking:
                return True
            until = self._absent_until.get(asked)
            if until is not None:
                if until > self._clock():
                    return False
                del self._absent_until[asked]
            self._asking.add(asked)
            self._to_ask.append(asked)
        self._wanted.set()
        return True

    def start(self, thread_name: str = "kvtier-probe") -> None:
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread after its current batch (not joined: a batch is bounded by the
        store's timeouts, and the thread is a daemon)."""
        self._stopping.set()
        self._wanted.set()

    def run_once(self) -> int:
        """Ask the server about every queued key (the thread's step; tests call it);
        returns how many keys were asked about."""
        with self._lock:
            batch, self._to_ask = self._to_ask, []
        if not batch:
            return 0
        by_store: dict[ExistsMany, list[bytes]] = {}
        for key, exists_many in batch:
            by_store.setdefault(exists_many, []).append(key)
        found: set[tuple[bytes, ExistsMany]] = set()
        for exists_many, keys in by_store.items():
            try:
                found |= {(key, exists_many) for key in exists_many(keys)}
            except Exception:  # a store maps faults to "absent"; this is a bug, keep serving
                logger.exception("kvtier %s: existence check failed", self._label)
        until = self._clock() + self._absent_ttl_s
        with self._lock:
            for asked in batch:
                self._asking.discard(asked)
                if asked not in found:
                    self._absent_until[asked] = until
            if len(self._absent_until) > _ABSENT_MAX:  # forget stale answers now and then
                now = self._clock()
                self._absent_until = {k: t for k, t in self._absent_until.items() if t > now}
        return len(batch)

    def _run(self) -> None:
        name_os_thread()
        while not self._stopping.is_set():
            if not self._wanted.wait(self._wait_s):
                continue
            self._wanted.clear()
            self.run_once()
