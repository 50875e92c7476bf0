"""Opening a tier's store off the scheduler thread, then keeping its view fresh.

The store's namespace includes the block-hash seed, which vLLM initialises only after the
scheduler (and the tier) exist, so the store cannot open in the tier's constructor. The opener
thread waits for the namespace (``namespace()`` raises the caller's ``not_ready`` exception
until it can be built; after ``OPEN_TIMEOUT_S`` that exception is the failure), opens the
store, and then does the tier's housekeeping every ``HOUSEKEEPING_INTERVAL_S`` until stopped:
``refresh`` (other processes' stores and evictions, when the store is shared by processes),
the usage figures (``used_bytes`` and the cap, which a store may need I/O to know) and the
caller's own periodic work.

A store that fails to open is a run-time fault (the start-up checks passed): ``on_failure``
hears of it, and ``store`` stays None for good (``failed`` is True).

Knows nothing of vLLM: the tier supplies the namespace builder and the callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from kvtier.format import Namespace
from kvtier.store import BlockStore
from kvtier.threads import name_os_thread

logger = logging.getLogger(__name__)

#: How long the opener waits for vLLM to seed its block hashes (done right after start-up).
OPEN_TIMEOUT_S = 600.0
#: How often the opener thread refreshes the store's view and the usage figures.
HOUSEKEEPING_INTERVAL_S = 1.0
#: How often the opener asks again for a namespace that cannot be built yet.
_NAMESPACE_POLL_S = 0.05

StoreOpener = Callable[[Namespace], BlockStore]


@dataclass(frozen=True, slots=True)
class Usage:
    """The store's bytes under its cap, and the cap (0: capacity is a server's)."""

    used_bytes: int = 0
    capacity_bytes: int = 0


class TierOpener:
    """The opener thread of one tier (see the module docstring)."""

    def __init__(
        self,
        *,
        label: str,
        thread_name: str,
        namespace: Callable[[], Namespace],
        not_ready: type[Exception],
        open_store: StoreOpener,
        on_open: Callable[[BlockStore, Namespace], None],
        on_failure: Callable[[BaseException], None],
        every_interval: Callable[[BlockStore], None] = lambda store: None,
        refresh: bool = False,
        interval_s: float = HOUSEKEEPING_INTERVAL_S,
        open_timeout_s: float = OPEN_TIMEOUT_S,
    ) -> None:
        """``on_open`` runs on the opener thread before lookups can see the store;
        ``refresh``: call ``store.refresh()`` every interval (a store shared by processes)."""
        self._label = label
        self._namespace = namespace
        self._not_ready = not_ready
        self._open = open_store
        self._on_open = on_open
        self._on_failure = on_failure
        self._every_interval = every_interval
        self._refresh = refresh
        self._interval_s = interval_s
        self._open_timeout_s = open_timeout_s
        self._opened: Future[BlockStore] = Future()
        self._store: BlockStore | None = None
        self._stopping = threading.Event()
        #: The latest usage figures (read on this thread; a store may need I/O to know them);
        #: None until the first housekeeping round.
        self.usage: Usage | None = None
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends housekeeping at its next wait (not joined: a refresh is bounded)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def store(self) -> BlockStore | None:
        """The open store; None while it opens or when it could not be opened. No wait."""
        if self._store is None and self._opened.done() and self._opened.exception() is None:
            self._store = self._opened.result()
        return self._store

    @property
    def failed(self) -> bool:
        """True once the store could not be opened (it never will be)."""
        return self._opened.done() and self._opened.exception() is not None

    @property
    def done(self) -> bool:
        """True once the store is open or failed to open."""
        return self._opened.done()

    def wait(self) -> BlockStore | None:
        """For I/O threads: the store once open, None if it never will be."""
        try:
            return self._opened.result()
        except BaseException:
            return None

    def _build_namespace(self) -> Namespace:
        deadline = time.monotonic() + self._open_timeout_s
        while True:
            try:
                return self._namespace()
            except self._not_ready:
                if time.monotonic() > deadline:
                    raise
                time.sleep(_NAMESPACE_POLL_S)

    def _run(self) -> None:
        name_os_thread()
        try:
            namespace = self._build_namespace()
            store = self._open(namespace)
        except BaseException as exc:
            self._on_failure(exc)
            self._opened.set_exception(exc)
            return
        try:
            self._on_open(store, namespace)
        finally:
            self._opened.set_result(store)
        self._housekeeping(store)

    def _housekeeping(self, store: BlockStore) -> None:
        while True:
            try:
                if self._refresh:
                    store.refresh()
                self._every_interval(store)
                self.usage = Usage(store.used_bytes(), store.capacity_bytes)
            except Exception:  # never let a refresh problem end the thread silently
                logger.exception("kvtier %s: refresh failed", self._label)
            if self._stopping.wait(self._interval_s):
                return
