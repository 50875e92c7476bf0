"""One store for every tenant: ``SealedStore`` and the tenant's view of it, ``TenantView``.

A sealed store (disk, shared) names and seals each record under one tenant's keys
(``RecordSealer``, kvtier.format.sealing): the name is a MAC of the block key under the
tenant's name key, the payload is encrypted under its data key. Every tenant's records live
in the same store: one folder, one index, one byte cap and one eviction order on disk, one
server prefix and one in-memory view on the shared tier. So no tenant can push the cache past
its cap or keep its records out of the eviction order, and an operator sizes one cache, not
one per tenant.

What differs between tenants is only the sealer, so a tenant's view is the store and a
sealer: each call through ``TenantView`` runs the store's own code with that sealer
(``SealedStore``'s methods that take one). A tenant's lookup computes its own names, so it
never finds another tenant's record; a record copied under its names fails authentication
(reason ``auth``) and is dropped as any damaged record is (quarantined on disk, deleted on the
server).

Rejected: a store opened per tenant. On disk each would keep its own in-memory map of the
root's index, session, access-time thread and counters, and see the others' records only
after a refresh; on the shared tier each would hold its own connections and view. Also
rejected: a tenant argument on every ``BlockStore`` method, which every store and every
wrapper (``LocalThenShared``) would have to take and pass on.

Engine-agnostic: a tenant is a sealer here; which request belongs to which tenant is the
tier's business (kvtier.runtime.tenants).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence

from kvtier.format.checksum import Buffer
from kvtier.format.sealing import RecordSealer
from kvtier.store.base import BlockStore, LoadClaim, Problem, StoreStats, check_put_many


class SealedStore(BlockStore):
    """A store that may seal its records, with one form of each per-record method that takes
    the sealer (``None``: plain records). The ``BlockStore`` methods use the store's own
    sealer, the one it was opened with (the default tenant's); ``tenant_view`` gives another
    tenant's."""

    #: The sealer the store was opened with; None for plain records.
    _sealer: RecordSealer | None = None

    def tenant_view(self, sealer: RecordSealer) -> BlockStore:
        """This store's records as the tenant of ``sealer`` names and opens them: the same
        records, index, cap, eviction and counters (module docstring). The store itself for
        its own sealer. Raises ``ValueError`` on a store of plain records: its names are the
        block keys, which no sealer changes."""
        if self._sealer is None:
            raise ValueError(f"{type(self).__name__} holds plain records: no tenant view")
        return self if sealer is self._sealer else TenantView(self, sealer)

    # -- BlockStore, with the store's own sealer ----------------------------------------
    def put(self, key: bytes, payload: Buffer) -> bool:
        return self._put(self._sealer, key, payload)

    def put_many(self, keys: Sequence[bytes], payloads: Sequence[Buffer]) -> list[bool]:
        return self._put_many(self._sealer, keys, payloads)

    def get_into(self, key: bytes, out: memoryview) -> bool:
        return self._get_into(self._sealer, key, out)

    def get_into_when(
        self, key: bytes, out: memoryview, claim: LoadClaim, bounce: memoryview
    ) -> bool:
        return self._get_into_when(self._sealer, key, out, claim, bounce)

    def get_many_into_when(
        self,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        bounce: memoryview,
    ) -> list[bool]:
        return self._get_many_into_when(self._sealer, keys, outs, claims, bounce)

    def contains(self, key: bytes) -> bool:
        return self._contains(self._sealer, key)

    def delete(self, key: bytes) -> bool:
        return self._delete(self._sealer, key)

    def keys(self) -> Iterator[bytes]:
        return self._keys(self._sealer)

    def payload_len(self, key: bytes) -> int | None:
        return self._payload_len(self._sealer, key)

    def exists_many(self, keys: Iterable[bytes]) -> set[bytes]:
        return self._exists_many(self._sealer, keys)

    # -- the same with a sealer ------------------------------------------------------------
    @abc.abstractmethod
    def _put(self, sealer: RecordSealer | None, key: bytes, payload: Buffer) -> bool: ...

    def _put_many(
        self, sealer: RecordSealer | None, keys: Sequence[bytes], payloads: Sequence[Buffer]
    ) -> list[bool]:
        """Each record in turn (``BlockStore.put_many``'s default); sealed one by one."""
        check_put_many(keys, payloads)
        return [
            self._put(sealer, key, payload) for key, payload in zip(keys, payloads, strict=True)
        ]

    @abc.abstractmethod
    def _get_into(self, sealer: RecordSealer | None, key: bytes, out: memoryview) -> bool: ...

    @abc.abstractmethod
    def _get_into_when(
        self,
        sealer: RecordSealer | None,
        key: bytes,
        out: memoryview,
        claim: LoadClaim,
        bounce: memoryview,
    ) -> bool: ...

    def _get_many_into_when(
        self,
        sealer: RecordSealer | None,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        bounce: memoryview,
    ) -> list[bool]:
        """Each key in turn (``BlockStore.get_many_into_when``'s default)."""
        return [
            self._get_into_when(sealer, key, out, claim, bounce)
            for key, out, claim in zip(keys, outs, claims, strict=True)
        ]

    @abc.abstractmethod
    def _contains(self, sealer: RecordSealer | None, key: bytes) -> bool: ...

    @abc.abstractmethod
    def _delete(self, sealer: RecordSealer | None, key: bytes) -> bool: ...

    @abc.abstractmethod
    def _keys(self, sealer: RecordSealer | None) -> Iterator[bytes]: ...

    @abc.abstractmethod
    def _payload_len(self, sealer: RecordSealer | None, key: bytes) -> int | None: ...

    def _exists_many(self, sealer: RecordSealer | None, keys: Iterable[bytes]) -> set[bytes]:
        """``contains`` per key (``BlockStore.exists_many``'s default)."""
        return {key for key in keys if self._contains(sealer, key)}

    @abc.abstractmethod
    def _verify(self, sealer: RecordSealer | None, fix: bool) -> list[Problem]: ...


class TenantView(BlockStore):
    """One tenant's view of a ``SealedStore`` (module docstring); as thread-safe as the store.

    Closing a view closes nothing: the store is its owner's. ``verify`` checks the whole
    store, authenticating with this tenant's keys; the records of other tenants fail that
    and are reported ``unauthenticated``, never repaired.
    """

    def __init__(self, store: SealedStore, sealer: RecordSealer) -> None:
        self.store = store
        self.sealer = sealer
        self.abilities = store.abilities

    @property  # type: ignore[override]
    def capacity_bytes(self) -> int:
        return self.store.capacity_bytes

    def put(self, key: bytes, payload: Buffer) -> bool:
        return self.store._put(self.sealer, key, payload)

    def put_many(self, keys: Sequence[bytes], payloads: Sequence[Buffer]) -> list[bool]:
        return self.store._put_many(self.sealer, keys, payloads)

    def get_into(self, key: bytes, out: memoryview) -> bool:
        return self.store._get_into(self.sealer, key, out)

    def get_into_when(
        self, key: bytes, out: memoryview, claim: LoadClaim, bounce: memoryview
    ) -> bool:
        return self.store._get_into_when(self.sealer, key, out, claim, bounce)

    def get_many_into_when(
        self,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        bounce: memoryview,
    ) -> list[bool]:
        return self.store._get_many_into_when(self.sealer, keys, outs, claims, bounce)

    def contains(self, key: bytes) -> bool:
        return self.store._contains(self.sealer, key)

    def delete(self, key: bytes) -> bool:
        return self.store._delete(self.sealer, key)

    def keys(self) -> Iterator[bytes]:
        return self.store._keys(self.sealer)

    def payload_len(self, key: bytes) -> int | None:
        return self.store._payload_len(self.sealer, key)

    def exists_many(self, keys: Iterable[bytes]) -> set[bytes]:
        return self.store._exists_many(self.sealer, keys)

    def verify(self, fix: bool = False) -> list[Problem]:
        return self.store._verify(self.sealer, fix)

    def used_bytes(self) -> int:
        return self.store.used_bytes()

    def stats(self) -> StoreStats:
        return self.store.stats()

    def refresh(self) -> int:
        return self.store.refresh()

    def without_server(self) -> BlockStore | None:
        return None if self.store.without_server() is None else self

    def tenant_view(self, sealer: RecordSealer) -> BlockStore:
        return self.store.tenant_view(sealer)

    def close(self) -> None:
        """Nothing: the store is its owner's to close."""
