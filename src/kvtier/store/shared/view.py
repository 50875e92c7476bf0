"""The in-memory view behind ``contains``: keys this process stored or found, LRU-bounded.

It is a belief, not the truth: the server may have evicted a key (the next lookup misses and
drops it) and another replica may have added keys (``exists_many`` learns them). Bounded to
``max_keys`` entries so a long-running engine's memory stays flat; the oldest leave first.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

from kvtier.format.record import HEADER_BYTES


class KeyView:
    """Thread-safe map key -> payload length, in least-recently-used order."""

    def __init__(self, max_keys: int) -> None:
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, int] = OrderedDict()
        self._record_bytes = 0

    def remember(self, key: bytes, payload_len: int) -> None:
        """Add or refresh ``key`` (it becomes the most recently used)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._record_bytes -= HEADER_BYTES + old
            self._entries[key] = payload_len
            self._record_bytes += HEADER_BYTES + payload_len
            while len(self._entries) > self._max_keys:
                _, dropped = self._entries.popitem(last=False)
                self._record_bytes -= HEADER_BYTES + dropped

    def forget(self, key: bytes) -> bool:
        """Drop ``key``; True if it was there."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._record_bytes -= HEADER_BYTES + old
            return old is not None

    def payload_len(self, key: bytes) -> int | None:
        return self._entries.get(key)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def snapshot(self) -> list[bytes]:
        with self._lock:
            return list(self._entries)

    def oldest(self, count: int) -> list[bytes]:
        """The ``count`` least recently used keys, oldest first."""
        with self._lock:
            return list(itertools.islice(self._entries, count))

    @property
    def record_bytes(self) -> int:
        """Header + payload bytes of every key in the view."""
        return self._record_bytes
