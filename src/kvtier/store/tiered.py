"""``LocalThenShared``: one store over a local store and a shared one, local first.

Why one composite store rather than two vLLM tiers: vLLM's tiering manager cascades a block to
every secondary tier only when the engine stores it into the host pool; a block *promoted*
from a tier into the host pool is never written to the other tiers. With a disk tier and a
shared tier side by side, a prefix restored from the shared store would therefore be fetched
over the network again after every host-pool eviction, forever. The composite restores from
the local store first, falls back to the shared store, and writes what it fetched back to the
local store (off the restore path, on a bounded queue), so the next restore is local.

* ``put``: both stores (the record is needed locally for speed and shared for other replicas);
  True when either holds it. ``put_many``: the same per record, each store's own
  ``put_many`` for the list (the shared store's for the keys it does not hold yet).
* ``get_into``, ``get_into_when`` and ``get_many_into_when``: local, then shared; a shared hit
  is copied once and queued for the local store (dropped and counted when the write-back
  queue is full).
* ``contains``: either store's in-memory view. ``exists_many``: the shared store's batched
  server check for keys the local store does not hold.
* ``abilities``: the local store's cap, the shared store's remote lookup, and two parts
  (``disk`` and ``shared``) for the metrics.
* ``tenant_view``: both stores as one tenant sees them (kvtier.store.tenant_view), over the
  same write-back queue; closing the view closes nothing.

Engine-agnostic: no vLLM import.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from kvtier.format.checksum import Buffer
from kvtier.format.sealing import RecordSealer
from kvtier.store.base import (
    BlockStore,
    LoadClaim,
    Problem,
    StoreAbilities,
    StoreStats,
    check_put_many,
)

log = logging.getLogger(__name__)

#: Most fetched records waiting to be written back to the local store.
WRITE_BACK_QUEUE = 64


class _WriteBack:
    """The write-back queue of a ``LocalThenShared`` and of its tenant views: one thread, one
    bound, one count."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(1, "kvtier-write-back")
        self.lock = threading.Lock()
        self.queued = 0
        #: Shared hits written back to the local store, and those dropped (queue full).
        self.written = 0
        self.dropped = 0


class LocalThenShared(BlockStore):
    """Local store first, shared store second, write-back of shared hits (see module doc)."""

    def __init__(
        self, local: BlockStore, shared: BlockStore, *, _write_back: _WriteBack | None = None
    ) -> None:
        """``_write_back``: the owner's queue, for a tenant view (``tenant_view``)."""
        self.local = local
        self.shared = shared
        self.abilities = StoreAbilities(
            remote_lookup=shared.abilities.remote_lookup,
            capacity=local.abilities.capacity,
            parts=True,
        )
        self._owner = _write_back is None
        self._wb = _WriteBack() if _write_back is None else _write_back
        self._write_back = self._wb.executor

    @property
    def written_back(self) -> int:
        """Shared hits written back to the local store (every tenant's)."""
        return self._wb.written

    @property
    def write_back_dropped(self) -> int:
        """Shared hits not written back: the queue was full."""
        return self._wb.dropped

    def tenant_view(self, sealer: RecordSealer) -> BlockStore:
        return LocalThenShared(
            self.local.tenant_view(sealer),
            self.shared.tenant_view(sealer),
            _write_back=self._wb,
        )

    @property  # type: ignore[override]
    def capacity_bytes(self) -> int:
        """The local store's cap (the shared store's capacity is its server's)."""
        return self.local.capacity_bytes

    def parts(self) -> list[tuple[str, BlockStore]]:
        """The stores under their metric names."""
        return [("disk", self.local), ("shared", self.shared)]

    def without_server(self) -> BlockStore | None:
        return self.local.without_server()

    # -- BlockStore ----------------------------------------------------------------------
    def put(self, key: bytes, payload: Buffer) -> bool:
        local_ok = self.local.put(key, payload)
        shared_ok = self.shared.contains(key) or self.shared.put(key, payload)
        return local_ok or shared_ok

    def put_many(self, keys: Sequence[bytes], payloads: Sequence[Buffer]) -> list[bool]:
        check_put_many(keys, payloads)
        stored = self.local.put_many(keys, payloads)
        send = [i for i, key in enumerate(keys) if not self.shared.contains(key)]
        sent = self.shared.put_many([keys[i] for i in send], [payloads[i] for i in send])
        shared_ok = [True] * len(keys)
        for i, ok in zip(send, sent, strict=True):
            shared_ok[i] = ok
        return [local_ok or ok for local_ok, ok in zip(stored, shared_ok, strict=True)]

    def get_into(self, key: bytes, out: memoryview) -> bool:
        if self.local.contains(key) and self.local.get_into(key, out):
            return True
        if not self.shared.get_into(key, out):
            return False
        self._queue_write_back(key, bytes(out))
        return True

    def get_into_when(
        self, key: bytes, out: memoryview, claim: LoadClaim, bounce: memoryview
    ) -> bool:
        """``get_into`` that writes ``out`` only after ``claim.claim()`` returned True: the local
        store's own ``get_into_when`` first (a disk store reads a record the page cache holds
        straight into ``out``, in one native call with the claim), then the shared store's.

        A local read that failed after its claim (a damaged record) leaves ``out`` partly
        written and the claim taken; a claim that can be given back (``release``, as an
        ``AbandonableLoad``'s) is given back before the shared store is asked, so its copy can
        still serve the block. Nothing writes ``out`` in between, and a load abandoned then
        is freed unread like any failed one.
        """
        if self.local.contains(key):
            if self.local.get_into_when(key, out, claim, bounce):
                return True
            claim.release()
        return self._from_shared(key, out, claim, bounce)

    def get_many_into_when(
        self,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        bounce: memoryview,
    ) -> list[bool]:
        """``get_into_when`` of each key: the local copies through the local store's own
        ``get_many_into_when`` (a disk store reads them in one native call), then each key
        that failed there from the shared store, as ``get_into_when`` does."""
        local = [i for i, key in enumerate(keys) if self.local.contains(key)]
        loaded = [False] * len(keys)
        found = self.local.get_many_into_when(
            [keys[i] for i in local], [outs[i] for i in local], [claims[i] for i in local], bounce
        )
        for i, ok in zip(local, found, strict=True):
            loaded[i] = ok
            if not ok:
                claims[i].release()
        rest = [i for i in range(len(keys)) if not loaded[i]]
        if not rest:
            return loaded
        fetched = self.shared.get_many_into_when(
            [keys[i] for i in rest], [outs[i] for i in rest], [claims[i] for i in rest], bounce
        )
        for i, ok in zip(rest, fetched, strict=True):
            loaded[i] = ok
            if ok:
                self._write_back_copy(keys[i], outs[i], claims[i])
        return loaded

    def _from_shared(
        self, key: bytes, out: memoryview, claim: LoadClaim, bounce: memoryview
    ) -> bool:
        fetched = self.shared.get_into_when(key, out, claim, bounce)
        if fetched:
            self._write_back_copy(key, out, claim)
        return fetched

    def _write_back_copy(self, key: bytes, out: memoryview, claim: LoadClaim) -> None:
        """Queue a copy of a row the shared store filled, taken before the load is finished:
        a load abandoned meanwhile has its row freed and maybe reused, so a copy is kept only
        when the load was still not abandoned once it was taken (vLLM reuses a row only after
        the abandon)."""
        payload = bytes(out)
        if not claim.abandoned:
            self._queue_write_back(key, payload)

    def _queue_write_back(self, key: bytes, payload: bytes) -> None:
        wb = self._wb
        with wb.lock:
            if wb.queued >= WRITE_BACK_QUEUE:
                wb.dropped += 1
                return
            wb.queued += 1
        try:
            self._write_back.submit(self._store_locally, key, payload)
        except RuntimeError:  # closed meanwhile
            with wb.lock:
                wb.queued -= 1

    def wait_write_back(self) -> None:
        """Return once every write-back queued so far is done (the queue is one FIFO
        thread, so a no-op queued now runs after them): for checks that read both parts."""
        try:
            self._write_back.submit(lambda: None).result()
        except RuntimeError:  # closed: close() already waited for them
            return

    def _store_locally(self, key: bytes, payload: bytes) -> None:
        wb = self._wb
        try:
            if self.local.put(key, payload):
                with wb.lock:
                    wb.written += 1
        except Exception:  # a store never raises for I/O; this is a bug, keep serving
            log.exception("kvtier: write-back to the local store failed")
        finally:
            with wb.lock:
                wb.queued -= 1

    def contains(self, key: bytes) -> bool:
        return self.local.contains(key) or self.shared.contains(key)

    def exists_many(self, keys: Iterable[bytes]) -> set[bytes]:
        """Keys either store holds; asks the shared server about the ones not held locally."""
        wanted = list(keys)
        local = {k for k in wanted if self.local.contains(k)}
        remote = [k for k in wanted if k not in local]
        return local | (self.shared.exists_many(remote) if remote else set())

    def delete(self, key: bytes) -> bool:
        removed_local = self.local.delete(key)
        removed_shared = self.shared.delete(key)
        return removed_local or removed_shared

    def keys(self) -> Iterator[bytes]:
        local_keys = set(self.local.keys())
        yield from local_keys
        yield from (k for k in self.shared.keys() if k not in local_keys)  # noqa: SIM118

    def payload_len(self, key: bytes) -> int | None:
        length = self.local.payload_len(key)
        return length if length is not None else self.shared.payload_len(key)

    def used_bytes(self) -> int:
        return self.local.used_bytes()

    def stats(self) -> StoreStats:
        """The local store's counters (per-part counters: ``parts()``)."""
        return self.local.stats()

    def refresh(self) -> int:
        return self.local.refresh() + self.shared.refresh()

    def verify(self, fix: bool = False) -> list[Problem]:
        return self.local.verify(fix) + self.shared.verify(fix)

    def close(self) -> None:
        if not self._owner:
            return  # a tenant view: the stores are the owner's
        self._write_back.shutdown(wait=True)
        self.local.close()
        self.shared.close()
