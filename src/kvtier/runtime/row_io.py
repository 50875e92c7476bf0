"""A tier's I/O threads' work between host-pool rows and a store's records.

A record holds a row's distinct KV slices (``kvtier.runtime.row_layout``): the row's prefix
when no rank repeats another's slice (read and written in place), else the slices gathered
into a thread's buffer on store and scattered into every rank's part of the row on load. A
load writes its row only once its load is claimed, so a load abandoned at its deadline never
writes the row vLLM has reused (``kvtier.dataplane.abandonable``). A load that fails is a
miss: a record of the wrong length is dropped (it can never load), the failure counted and the
key kept out of lookups (``kvtier.runtime.health``). Each block is stored and loaded through
its request's tenant's view of the store (``kvtier.runtime.tenants.TenantViews``).

Called on the tier's I/O threads only; every buffer is per thread. Knows nothing of vLLM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvtier.dataplane.abandonable import AbandonableLoad, BounceBuffers, LoadState
from kvtier.runtime.health import TierHealth
from kvtier.runtime.jobs import STORE_BATCH_BLOCKS
from kvtier.runtime.row_layout import RowLayout
from kvtier.runtime.stats import TierStats
from kvtier.runtime.tenants import DEFAULT_TENANT, TenantViews
from kvtier.store import BlockStore

logger = logging.getLogger(__name__)


class RowIO:
    """Reads and writes between one host pool's rows and a tier's store."""

    def __init__(
        self,
        pool: memoryview,
        pool_row_bytes: int,
        layout: RowLayout,
        *,
        wait_store: Callable[[], BlockStore | None],
        stats: TierStats,
        health: TierHealth,
        label: str,
        tenants: TenantViews | None = None,
    ) -> None:
        """``pool``: the host pool's rows (any shape); ``wait_store``: the store once open,
        None if it never will be (I/O threads may wait for it); ``tenants``: each tenant's
        view of it (default: the store itself for every tenant)."""
        # A 2-D memoryview cannot be indexed by row; a flat byte view can be sliced without copy.
        self._pool_bytes = pool.cast("B")
        self._pool_row_bytes = pool_row_bytes
        self._layout = layout
        #: Payload bytes of one record: a row's distinct KV slices.
        self.record_bytes = layout.record_bytes
        self._wait_store = wait_store
        self._tenants = tenants if tenants is not None else TenantViews(None)
        self._stats = stats
        self._health = health
        self.label = label
        self._bounce = BounceBuffers(self.record_bytes)
        # A record that is not a row prefix is gathered here (store) or read here (load); a
        # batch of stores (a job table's store task, STORE_BATCH_BLOCKS at most) gathers its
        # n-th record into the n-th buffer (allocated on first use).
        self._gathered = [BounceBuffers(self.record_bytes) for _ in range(STORE_BATCH_BLOCKS)]

    def timed_read(self, store: BlockStore, key: bytes) -> float | None:
        """Seconds one read of ``key`` took (into a bounce buffer), None if it missed."""
        started = time.perf_counter()
        if not store.get_into(key, self._bounce.get()):
            return None
        return time.perf_counter() - started

    def release(self) -> None:
        """Drop this object's view of the pool (so the pool can be unmapped); raises
        ``BufferError`` while a transfer still holds a row of it."""
        self._pool_bytes.release()

    def _row(self, row: int) -> memoryview:
        """The whole row (padding included)."""
        # A slice past the pool's end is short or empty, and a negative row counts from the
        # end: either would store a record of the wrong length (or another row's bytes).
        if not 0 <= row < self._pool_bytes.nbytes // self._pool_row_bytes:
            raise IndexError(f"host-pool row {row} outside the pool's rows")
        start = row * self._pool_row_bytes
        return self._pool_bytes[start : start + self._pool_row_bytes]

    def _record_of(self, row: int, slot: int = 0) -> memoryview:
        """The record's bytes of ``row``: the row's prefix, or its slices gathered (into the
        thread's ``slot``-th gather buffer)."""
        row_view = self._row(row)
        if self._layout.is_prefix:
            return row_view[: self.record_bytes]
        record = self._gathered[slot].get()
        self._layout.gather(row_view, record)
        return record

    def _store_of(self, cache_salt: str | None) -> BlockStore | None:
        """The store once open, as the tenant of ``cache_salt`` sees it."""
        store = self._wait_store()
        return None if store is None else self._tenants.of(store, cache_salt)

    def store_share(
        self, keys: list[bytes], rows: list[int], cache_salt: str | None = DEFAULT_TENANT
    ) -> list[bool]:
        """A thread's share of a store job (``store_many`` into the store as the tenant of
        ``cache_salt`` sees it); all failed when the store never opens."""
        store = self._store_of(cache_salt)
        return [False] * len(keys) if store is None else self.store_many(store, keys, rows)

    def store_many(self, store: BlockStore, keys: list[bytes], rows: list[int]) -> list[bool]:
        """Store each block's record with ``put_many``, STORE_BATCH_BLOCKS at a time; per
        block, whether the store holds it. A block whose key already holds a record of this
        length is not written again; a record of another length can never load into a row,
        so it is replaced."""
        stored = [False] * len(keys)
        for start in range(0, len(keys), STORE_BATCH_BLOCKS):
            batch = range(start, min(start + STORE_BATCH_BLOCKS, len(keys)))
            started = time.perf_counter()
            writes = [i for i in batch if store.payload_len(keys[i]) != self.record_bytes]
            for i in batch:
                stored[i] = True  # until a write says otherwise
            if writes:
                records = [self._record_of(rows[i], n) for n, i in enumerate(writes)]
                outcomes = store.put_many([keys[i] for i in writes], records)
                for i, ok in zip(writes, outcomes, strict=True):
                    stored[i] = ok
            self._stats.stored_many(time.perf_counter() - started, sum(stored[i] for i in batch))
        for key, ok in zip(keys, stored, strict=True):
            if ok:
                self._health.stored(key)  # a fresh good copy is authoritative
        return stored

    def load_share(
        self,
        keys: list[bytes],
        rows: list[int],
        loads: list[AbandonableLoad],
        cache_salt: str | None = DEFAULT_TENANT,
    ) -> list[bool]:
        """A thread's share of a load job: each block verified into its row, never after its
        load was abandoned (the store writes a row only once its load is claimed). Read in
        one call for the share where the rows are the records (``get_many_into_when``)."""
        store = self._store_of(cache_salt)
        started = time.perf_counter()
        loaded = [False] * len(keys) if store is None else self._read(store, keys, rows, loads)
        seconds = (time.perf_counter() - started) / max(1, len(keys))
        for key, ok, load in zip(keys, loaded, loads, strict=True):
            if ok:
                self._stats.loaded(seconds)  # the share's I/O time, spread over its blocks
                self._health.load_completed()
            elif load.state is not LoadState.ABANDONED:  # abandoned: counted then
                self._load_failed(store, key)
        return loaded

    def _load_failed(self, store: BlockStore | None, key: bytes) -> None:
        if store is not None and store.payload_len(key) not in (None, self.record_bytes):
            store.delete(key)  # it can never load: drop it so lookups stop offering it
        self._stats.load_failed()
        self._health.load_failed([key])
        logger.warning(
            "kvtier %s: load of block %s failed; it will be recomputed", self.label, key.hex()[:16]
        )

    def _read(
        self,
        store: BlockStore,
        keys: list[bytes],
        rows: list[int],
        loads: list[AbandonableLoad],
    ) -> list[bool]:
        try:
            if self._layout.is_prefix:
                outs = [self._row(row)[: self.record_bytes] for row in rows]
                return store.get_many_into_when(keys, outs, loads, self._bounce.get())
            return [
                self._read_gathered(store, key, row, load)
                for key, row, load in zip(keys, rows, loads, strict=True)
            ]
        finally:
            for load in loads:
                load.finish()  # a no-op unless claimed (copying or written)

    def _read_gathered(
        self, store: BlockStore, key: bytes, row: int, load: AbandonableLoad
    ) -> bool:
        """A block whose record is gathered from slices of its row: read into this thread's
        record buffer, then scattered into the row (claimed: the row is this load's)."""
        record = self._gathered[0].get()
        if not store.get_into_when(key, record, ClaimForBuffer(load), self._bounce.get()):
            return False
        self._layout.scatter(record, self._row(row))
        load.written()
        return True


class ClaimForBuffer:
    """A load's claim for a read into a buffer of the thread's, not into the row: the store
    claims (and may give the claim back), but cannot mark the load written, since the row is
    written only afterwards (the scatter); nor make the claim itself (no ``native_cell``)."""

    __slots__ = ("_load",)

    native_cell = None

    def __init__(self, load: AbandonableLoad) -> None:
        self._load = load

    def claim(self) -> bool:
        return self._load.claim()

    def written(self) -> None:
        """The row is written after the store returns (the scatter); marked there."""

    def release(self) -> bool:
        return self._load.release()

    @property
    def abandoned(self) -> bool:
        return self._load.abandoned
