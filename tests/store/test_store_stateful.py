"""Random put/get/delete/reopen sequences against a dict model, for every store.

Invariants after every step: usage within the cap; ``verify()`` finds nothing; the backend's
ground truth (record files decoded with kvtier.format, or the memory store's dict) holds
exactly the store's keys, with the model's bytes; every key the store holds reads back
byte-identical to the model; the store holds no key the model lacks (it may hold fewer:
eviction).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvtier.format import HEADER_BYTES
from kvtier.store import BlockStore, DiskStore, MemoryStore
from kvtier.store.disk.root import INDEX_ALLOWANCE_BYTES
from tests.support.store import disk_ground_truth, key_of, make_namespace

KEYS = st.integers(min_value=0, max_value=7).map(key_of)
SIZES = st.sampled_from([512, 1024, 4096])
RECORDS_IN_CAP = 4


class StoreMachine(RuleBasedStateMachine):
    """Shared rules; subclasses choose the store."""

    overhead = 0
    #: Bytes of the cap a backend keeps for itself (the disk store's index files).
    reserved = 0

    def __init__(self) -> None:
        super().__init__()
        self.capacity = self.reserved + RECORDS_IN_CAP * (self.overhead + 4096)
        self.model: dict[bytes, bytes] = {}
        self.store = self.open()

    def open(self) -> BlockStore:
        raise NotImplementedError

    def ground_truth(self) -> dict[bytes, bytes]:
        """What the backend holds, read around the store's API."""
        raise NotImplementedError

    @rule(key=KEYS, size=SIZES, fill=st.integers(0, 255))
    def put(self, key: bytes, size: int, fill: int) -> None:
        payload = bytes([fill]) * size
        if self.store.put(key, payload):
            self.model[key] = payload

    @rule(key=KEYS)
    def get(self, key: bytes) -> None:
        size = self.store.payload_len(key)
        got = self.store.get(key)
        if key not in self.model:
            assert size is None and got is None
        elif got is not None:
            assert got == self.model[key]

    @rule(key=KEYS)
    def delete(self, key: bytes) -> None:
        self.store.delete(key)
        self.model.pop(key, None)
        assert not self.store.contains(key)

    @rule(first=st.integers(100, 200))
    def pressure(self, first: int) -> None:
        for i in range(first, first + RECORDS_IN_CAP + 1):
            payload = bytes([i % 256]) * 4096
            assert self.store.put(key_of(i), payload)
            self.model[key_of(i)] = payload

    @invariant()
    def within_cap(self) -> None:
        assert self.store.used_bytes() <= self.capacity

    @invariant()
    def verify_finds_nothing(self) -> None:
        assert self.store.verify() == []

    @invariant()
    def ground_truth_agrees_with_store_and_model(self) -> None:
        truth = self.ground_truth()
        assert sorted(truth) == sorted(self.store.keys())
        for key, payload in truth.items():
            assert payload == self.model[key]

    @invariant()
    def store_agrees_with_model(self) -> None:
        for key in self.store.keys():  # noqa: SIM118 (a store, not a dict)
            assert key in self.model
            assert self.store.get(key) == self.model[key]

    def teardown(self) -> None:
        self.store.close()


class MemoryMachine(StoreMachine):
    def open(self) -> BlockStore:
        return MemoryStore(self.capacity)

    def ground_truth(self) -> dict[bytes, bytes]:
        assert isinstance(self.store, MemoryStore)
        return dict(self.store._records)


class DiskMachine(StoreMachine):
    overhead = HEADER_BYTES
    reserved = INDEX_ALLOWANCE_BYTES

    def open(self) -> BlockStore:
        if not hasattr(self, "root"):
            self.root = Path(tempfile.mkdtemp(prefix="kvtier-sm-")) / "root"
        return DiskStore(self.root, make_namespace(), self.capacity, free_space_floor_bytes=0)

    def ground_truth(self) -> dict[bytes, bytes]:
        assert isinstance(self.store, DiskStore)
        return disk_ground_truth(self.store.namespace_dir, self.store.namespace)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self.open()

    def teardown(self) -> None:
        super().teardown()
        shutil.rmtree(self.root.parent, ignore_errors=True)


_SETTINGS = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMemoryStoreStateful = MemoryMachine.TestCase
TestMemoryStoreStateful.settings = _SETTINGS
TestDiskStoreStateful = DiskMachine.TestCase
TestDiskStoreStateful.settings = _SETTINGS
