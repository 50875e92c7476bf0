"""Every store passes the shared contract (tests/store/conformance.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtier.format import HEADER_BYTES
from kvtier.store import BlockStore, DiskStore, MemoryStore
from tests.support.conformance import StoreContract
from tests.support.store import PAYLOAD_BYTES


class TestMemoryStore(StoreContract):
    def make_store(self, records: int = 8) -> BlockStore:
        return MemoryStore(capacity_bytes=records * PAYLOAD_BYTES)

    def record_bytes(self, payload_len: int) -> int:
        return payload_len


class TestDiskStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _bind(self, open_disk: Callable[..., DiskStore]) -> None:
        self._open = open_disk

    def make_store(self, records: int = 8) -> BlockStore:
        return self._open(records=records)

    def record_bytes(self, payload_len: int) -> int:
        return HEADER_BYTES + payload_len
