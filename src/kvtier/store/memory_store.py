"""``MemoryStore``: the in-memory reference store, also the test fake for adapters.

It keeps payload copies in a dict in LRU order under one lock, charges each record its
payload length against ``capacity_bytes``, and evicts least recently used records until a
new one fits. Nothing is persisted and nothing is shared between processes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator

from kvtier.errors import ConfigError
from kvtier.format.checksum import Buffer
from kvtier.format.record import check_key
from kvtier.store.base import BlockStore, Problem, StoreAbilities, StoreStats


class MemoryStore(BlockStore):
    """Byte-capped LRU store in process memory (see ``BlockStore`` for the contracts)."""

    abilities = StoreAbilities(capacity=True)

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ConfigError(
                f"memory store: capacity_bytes={capacity_bytes}; give a size such as 1GiB"
            )
        self.capacity_bytes = capacity_bytes
        self._records: OrderedDict[bytes, bytes] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self._stats = StoreStats()
        self._closed = False

    def put(self, key: bytes, payload: Buffer) -> bool:
        check_key(key)
        data = bytes(payload)
        with self._lock:
            if self._closed or len(data) > self.capacity_bytes:
                self._stats.put_failures += 1
                return False
            self._drop(key)
            while self._used + len(data) > self.capacity_bytes:
                self._drop(next(iter(self._records)))
                self._stats.evictions += 1
            self._records[key] = data
            self._used += len(data)
            self._stats.puts += 1
            self._stats.bytes_written += len(data)
            return True

    def get_into(self, key: bytes, out: memoryview) -> bool:
        out = memoryview(out)
        with self._lock:
            data = self._records.get(key)
            if data is None or out.nbytes != len(data) or self._closed:
                self._stats.misses += 1
                return False
            out.cast("B")[:] = data
            self._records.move_to_end(key)
            self._stats.hits += 1
            self._stats.bytes_read += len(data)
            return True

    def contains(self, key: bytes) -> bool:
        return key in self._records

    def delete(self, key: bytes) -> bool:
        with self._lock:
            return self._drop(key)

    def keys(self) -> Iterator[bytes]:
        with self._lock:
            return iter(list(self._records))

    def payload_len(self, key: bytes) -> int | None:
        data = self._records.get(key)
        return None if data is None else len(data)

    def used_bytes(self) -> int:
        return self._used

    def stats(self) -> StoreStats:
        with self._lock:
            return self._stats.copy()

    def verify(self, fix: bool = False) -> list[Problem]:
        with self._lock:
            actual = sum(len(v) for v in self._records.values())
            if actual == self._used:
                return []
            problem = Problem("counter", f"used_bytes {self._used}, records hold {actual}")
            if fix:
                self._used = actual
            return [problem if not fix else Problem(problem.kind, problem.detail, fixed=True)]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._records.clear()
            self._used = 0

    def _drop(self, key: bytes) -> bool:
        data = self._records.pop(key, None)
        if data is None:
            return False
        self._used -= len(data)
        return True
