"""Every store passes the shared contract (tests/store/conformance.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtier.format import HEADER_BYTES
from kvtier.store import BlockStore, DiskStore, MemoryStore
from kvtier.store.index import charge
from tests.support.conformance import StoreContract
from tests.support.store import PAYLOAD_BYTES, disk_ground_truth


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
