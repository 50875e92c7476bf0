"""Every store passes the shared contract (tests/store/conformance.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtier.format import HEADER_BYTES
from kvtier.store import BlockStore, DiskStore, MemoryStore
from kvtier.store.disk.index import charge
from kvtier.store.tiered import LocalThenShared
from tests.support.conformance import StoreContract
from tests.support.fake_remote import FakeRemoteStore
from tests.support.store import PAYLOAD_BYTES, disk_ground_truth, key_of, payload_of


class TestMemoryStore(StoreContract):
    def make_store(self, records: int = 8) -> BlockStore:
        return MemoryStore(capacity_bytes=records * PAYLOAD_BYTES)

    def record_bytes(self, payload_len: int) -> int:
        return payload_len

    def ground_truth(self, store: BlockStore) -> dict[bytes, bytes]:
        assert isinstance(store, MemoryStore)
        return dict(store._records)


class TestDiskStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _bind(self, open_disk: Callable[..., DiskStore]) -> None:
        self._open = open_disk

    def make_store(self, records: int = 8) -> BlockStore:
        return self._open(records=records)

    def record_bytes(self, payload_len: int) -> int:
        return charge(HEADER_BYTES + payload_len)

    def ground_truth(self, store: BlockStore) -> dict[bytes, bytes]:
        assert isinstance(store, DiskStore)
        return disk_ground_truth(store.namespace_dir, store.namespace)


class TestLocalThenShared(StoreContract):
    """The composite over a MemoryStore and a fake shared server of the same cap: puts reach
    both, so both evict alike; the cap, ``used_bytes`` and ``stats`` are the local part's."""

    def make_store(self, records: int = 8) -> BlockStore:
        store = LocalThenShared(
            MemoryStore(capacity_bytes=records * PAYLOAD_BYTES),
            FakeRemoteStore(capacity_bytes=records * PAYLOAD_BYTES),
        )
        self._opened.append(store)
        return store

    @pytest.fixture(autouse=True)
    def _close(self) -> object:
        self._opened: list[LocalThenShared] = []
        yield
        for store in self._opened:
            store.close()

    def record_bytes(self, payload_len: int) -> int:
        return payload_len

    def ground_truth(self, store: BlockStore) -> dict[bytes, bytes]:
        """Both parts' records (the local one wins where they differ: it is read first)."""
        assert isinstance(store, LocalThenShared)
        store.wait_write_back()
        assert isinstance(store.local, MemoryStore) and isinstance(store.shared, MemoryStore)
        return {**store.shared._records, **store.local._records}

    def assert_truth(self, store: BlockStore, expected: dict[bytes, bytes | None]) -> None:
        """As the contract's, reading the local part's records first: a shared hit is
        written back to the local part and may evict a record there, checked already."""
        assert isinstance(store, LocalThenShared)
        truth = self.ground_truth(store)
        assert sorted(truth) == sorted(store.keys())
        for key, payload in expected.items():
            assert truth.get(key) == payload, key.hex()[:16]
        for key in sorted(truth, key=lambda k: not store.local.contains(k)):
            assert store.get(key) == truth[key], key.hex()[:16]

    def test_get_of_unknown_key_is_miss(self) -> None:
        """Replaces the contract's: the miss is counted by the part that was asked (the
        shared one: the local part's view says it does not hold the key)."""
        store = self.make_store()
        assert isinstance(store, LocalThenShared)
        assert not store.contains(key_of(9))
        assert self.read(store, key_of(9)) is None
        assert sum(part.stats().misses for _, part in store.parts()) == 1

    def test_least_recently_used_is_evicted_first(self) -> None:
        """Replaces the contract's: the local part evicts its least recently used record;
        the shared part (its own LRU: reads served locally never touch it) still serves it."""
        store = self.make_store(records=4)
        assert isinstance(store, LocalThenShared)
        for i in range(4):
            store.put(key_of(i), payload_of(i))
        assert self.read(store, key_of(0)) == payload_of(0)
        store.put(key_of(4), payload_of(4))
        assert store.local.contains(key_of(0)) and not store.local.contains(key_of(1))
        assert store.shared.contains(key_of(1)) and not store.shared.contains(key_of(0))
        assert self.read(store, key_of(1)) == payload_of(1), "the shared part serves it"
        store.wait_write_back()
        assert store.local.contains(key_of(1)), "a shared hit is written back"
        self.assert_truth(store, {key_of(4): payload_of(4)})
