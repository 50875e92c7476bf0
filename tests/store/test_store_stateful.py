"""Random put/put_many/get/delete/reopen sequences against a dict model, for every store.

Invariants after every step: usage within the cap; ``verify()`` finds nothing; the backend's
ground truth (record files decoded with kvtier.format, or the memory store's dict) holds
exactly the store's keys, with the model's bytes; every key the store holds reads back
byte-identical to the model; the store holds no key the model lacks (it may hold fewer:
eviction).

The disk store runs a second time with sealed records, adding two rules: a rotation to a new
write key (the store reopened with the new key first, the old ones after it: every record
stays found and reads back the model's bytes) and a record copied under another block key's
name (a miss, quarantined as ``auth``). After a rotation a block key may have a record under
each key; the store reads the newest key's, and the model stays one payload per key because
the older record is always the less recently used one (it was written or last read before
the newer one was written), so eviction takes it first.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.format import HEADER_BYTES
from kvtier.format.record import decode_header, encode_header
from kvtier.format.sealing import KeyRing, MasterKey
from kvtier.store import BlockStore, DiskStore, MemoryStore
from kvtier.store.disk.root import INDEX_ALLOWANCE_BYTES
from kvtier.store.disk.schema import ALLOC_UNIT
from tests.support.store import disk_ground_truth, key_of, make_namespace

KEYS = st.integers(min_value=0, max_value=7).map(key_of)
SIZES = st.sampled_from([512, 1024, 4096])
RECORDS_IN_CAP = 4
#: First key of a ``pressure`` burst: ``key_of(i)`` for i in PRESSURE_FIRST..+RECORDS_IN_CAP.
PRESSURE_FIRST = (100, 200)
#: Every block key a machine may put.
ALL_KEYS = tuple(
    key_of(i)
    for i in (*range(8), *range(PRESSURE_FIRST[0], PRESSURE_FIRST[1] + RECORDS_IN_CAP + 1))
)


class StoreMachine(RuleBasedStateMachine):
    """Shared rules; subclasses choose the store."""

    overhead = 0
    #: Bytes of the cap a backend keeps for itself (the disk store's index files).
    reserved = 0
    #: Payload bytes of a ``pressure`` record; the cap holds RECORDS_IN_CAP of them.
    pressure_bytes = 4096

    def __init__(self) -> None:
        super().__init__()
        self.capacity = self.reserved + RECORDS_IN_CAP * (self.overhead + self.pressure_bytes)
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

    @rule(records=st.lists(st.tuples(KEYS, SIZES, st.integers(0, 255)), min_size=1, max_size=6))
    def put_many(self, records: list[tuple[bytes, int, int]]) -> None:
        payloads = [bytes([fill]) * size for _, size, fill in records]
        keys = [key for key, _, _ in records]
        for key, payload, stored in zip(
            keys, payloads, self.store.put_many(keys, payloads), strict=True
        ):
            if stored:  # in order: a key's later record replaces its earlier one
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

    @rule(first=st.integers(*PRESSURE_FIRST))
    def pressure(self, first: int) -> None:
        for i in range(first, first + RECORDS_IN_CAP + 1):
            payload = bytes([i % 256]) * self.pressure_bytes
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


#: Most master keys the sealed machine's ring grows to (each rotation puts one more first).
MAX_KEYS = 3


class SealedDiskMachine(DiskMachine):
    """The disk store with sealed records, its key ring rotated now and then."""

    # Sealed names spread over the 256 fan-out folders, each charged against the cap: room
    # for all of a namespace's folders (kvtier.store.disk.folders), so the folders never
    # leave a pressure burst without room. Pressure records large against that room, so
    # bursts still evict.
    reserved = INDEX_ALLOWANCE_BYTES + 261 * ALLOC_UNIT
    pressure_bytes = 256 << 10

    def __init__(self) -> None:
        # Fixed secrets, not random ones, so that a failing example replays.
        self.secrets = [bytes([1]) * 32]
        super().__init__()

    def open(self) -> BlockStore:
        if not hasattr(self, "root"):
            self.root = Path(tempfile.mkdtemp(prefix="kvtier-sm-")) / "root"
        self.sealer = KeyRing([MasterKey(s) for s in self.secrets]).tenant()
        return DiskStore(
            self.root,
            make_namespace(),
            self.capacity,
            free_space_floor_bytes=0,
            sealer=self.sealer,
        )

    def ground_truth(self) -> dict[bytes, bytes]:
        assert isinstance(self.store, DiskStore)
        return disk_ground_truth(
            self.store.namespace_dir, self.store.namespace, self.sealer, ALL_KEYS
        )

    def held(self) -> list[bytes]:
        """The block keys the store finds (``keys()`` of a sealed store lists only the keys
        this process has put or read, since names cannot be turned back into keys)."""
        return [key for key in ALL_KEYS if self.store.contains(key)]

    @precondition(lambda self: len(self.secrets) < MAX_KEYS)
    @rule()
    def rotate(self) -> None:
        before = self.held()
        self.store.close()
        self.secrets.insert(0, bytes([len(self.secrets) + 1]) * 32)
        self.store = self.open()
        assert self.held() == before
        for key in before:
            assert self.store.get(key) == self.model[key]

    @rule(data=st.data())
    def copy_under_another_name(self, data: st.DataObject) -> None:
        """Someone with write access and no key copies one record over another's file, the
        header rewritten to the other's name (its checksum is keyless, so it can be redone):
        a miss, quarantined as ``auth``, and the key is then deleted to keep the model exact
        (an older record of it may be found next)."""
        assert isinstance(self.store, DiskStore)
        held = self.held()
        pairs = [
            (a, b)
            for a in held
            for b in held
            if a != b and self.store.payload_len(a) == self.store.payload_len(b)
        ]
        if not pairs:
            return
        source, target = data.draw(st.sampled_from(pairs))
        source_path, target_path = self.store.record_path(source), self.store.record_path(target)
        assert source_path is not None and target_path is not None
        record = source_path.read_bytes()
        digest = self.store.namespace.digest()
        header = decode_header(record[:HEADER_BYTES], digest, name_of(source_path))
        moved = dataclasses.replace(header, key=name_of(target_path))
        target_path.write_bytes(encode_header(moved) + record[HEADER_BYTES:])
        auth_failures = self.store.stats().corrupt.get("auth", 0)
        assert self.store.get(target) is None
        assert self.store.stats().corrupt.get("auth", 0) == auth_failures + 1
        assert self.store.get(source) == self.model[source]
        self.store.delete(target)
        self.model.pop(target, None)

    @invariant()
    def ground_truth_agrees_with_store_and_model(self) -> None:
        truth = self.ground_truth()
        assert sorted(truth) == sorted(self.held())
        for key, payload in truth.items():
            assert payload == self.model[key]


def name_of(record_path: Path) -> bytes:
    """The stored name of a record file (``<name hex>.<record id>.kvb``)."""
    return bytes.fromhex(record_path.name.split(".")[0])


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
TestSealedDiskStoreStateful = SealedDiskMachine.TestCase
TestSealedDiskStoreStateful.settings = _SETTINGS
