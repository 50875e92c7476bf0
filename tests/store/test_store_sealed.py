"""The disk store with sealed records: the contract, names that reveal nothing, and every
tampering a clean miss, quarantined and counted by reason."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvtier import native
from kvtier.buffers import address_of
from kvtier.dataplane.abandonable import AbandonableLoad, LoadState
from kvtier.format import HEADER_BYTES
from kvtier.format.record import decode_header, encode_header
from kvtier.format.sealing import KeyRing, MasterKey, RecordSealer
from kvtier.store import BlockStore, DiskStore, RecordIO, RecordWriter
from kvtier.store.disk.gc import collect
from kvtier.store.disk.index import ALLOC_UNIT, charge
from tests.support.conformance import StoreContract
from tests.support.store import (
    PAYLOAD_BYTES,
    aligned_buffer,
    disk_capacity,
    disk_ground_truth,
    files_under,
    key_of,
    payload_of,
)

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))


def sealer_of(*secrets: bytes, tenant: str | None = None) -> RecordSealer:
    return KeyRing([MasterKey(s) for s in secrets or (KEY_A,)]).tenant(tenant)


def hashlike(i: int) -> bytes:
    """A block key shaped like vLLM's: a sha256 and a group index."""
    return hashlib.sha256(i.to_bytes(4, "big")).digest() + bytes(4)


class TestSealedDiskStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _bind(self, open_disk: Callable[..., DiskStore]) -> None:
        self._open = open_disk
        self._sealer = sealer_of()

    def make_store(self, records: int = 8) -> BlockStore:
        return self._open(records=records, sealer=self._sealer)

    def record_bytes(self, payload_len: int) -> int:
        return charge(HEADER_BYTES + payload_len)

    def ground_truth(self, store: BlockStore) -> dict[bytes, bytes]:
        assert isinstance(store, DiskStore)
        return disk_ground_truth(store.namespace_dir, store.namespace, self._sealer)

    def test_cap_is_never_exceeded(self) -> None:
        """Replaces the contract's, whose bound counts records only: key_of's keys share a
        first byte (one fan-out folder) while names spread over up to 256 folders, each
        charged against the cap as real block hashes' are. The cap bounds the footprint."""
        store = self._open(capacity_bytes=disk_capacity(4) + 64 * ALLOC_UNIT, sealer=self._sealer)
        rng = random.Random(7)
        for i in range(60):
            assert store.put(key_of(i), payload_of(i, rng.choice([1024, 4096, PAYLOAD_BYTES])))
            assert store.footprint_bytes() <= store.capacity_bytes
        assert store.stats().evictions > 0
        self.assert_truth(store, {})


def record_file(store: DiskStore, key: bytes) -> Path:
    path = store.record_path(key)
    assert path is not None
    return path


def test_no_file_name_or_file_holds_a_block_hash(open_disk: Callable[..., DiskStore]) -> None:
    store = open_disk(sealer=sealer_of())
    keys = [hashlike(i) for i in range(6)]
    for i, key in enumerate(keys):
        assert store.put(key, payload_of(i))
    names = [str(p.relative_to(store.root)) for p in files_under(store.root)]
    contents = b"".join(p.read_bytes() for p in files_under(store.namespace_dir / "blocks"))
    for key in keys:
        for form in (key, key[:32]):
            assert not any(form.hex() in n for n in names)
            assert form not in contents and form.hex().encode() not in contents


def test_a_flipped_byte_is_a_miss_quarantined_as_auth(open_disk: Callable[..., DiskStore]) -> None:
    store = open_disk(sealer=sealer_of())
    store.put(key_of(1), payload_of(1))
    path = record_file(store, key_of(1))
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 5] ^= 0x10
    path.write_bytes(bytes(data))
    assert store.get(key_of(1)) is None
    assert store.stats().corrupt == {"auth": 1} and store.stats().quarantined == 1
    assert not store.contains(key_of(1))


def test_a_record_moved_under_another_block_key_is_a_miss(
    open_disk: Callable[..., DiskStore],
) -> None:
    sealer = sealer_of()
    store = open_disk(sealer=sealer)
    store.put(key_of(1), payload_of(1))
    store.put(key_of(2), payload_of(2))
    one, two = record_file(store, key_of(1)), record_file(store, key_of(2))
    # Someone with write access and no key: copy record 1 over record 2, the header rewritten
    # to name 2 (its checksum is keyless, so it can be redone).
    data = one.read_bytes()
    header = decode_header(data[:HEADER_BYTES], store.namespace.digest(), header_key(data))
    moved = dataclasses.replace(header, key=sealer.name(store.namespace.digest(), key_of(2)))
    two.write_bytes(encode_header(moved) + data[HEADER_BYTES:])
    assert store.get(key_of(2)) is None
    assert store.stats().corrupt == {"auth": 1}
    assert store.get(key_of(1)) == payload_of(1)


def header_key(record: bytes) -> bytes:
    return record[48 : 48 + int.from_bytes(record[14:16], "little")]


def test_another_tenant_neither_finds_nor_opens_a_tenants_records(
    open_disk: Callable[..., DiskStore],
) -> None:
    ring = KeyRing([MasterKey(KEY_A)])
    alice = open_disk(sealer=ring.tenant("alice"))
    bob = open_disk(sealer=ring.tenant("bob"))
    alice.put(key_of(1), payload_of(1))
    bob.refresh()
    assert not bob.contains(key_of(1)) and bob.get(key_of(1)) is None
    # Alice's file planted under Bob's name for the same block: the tag refuses it.
    bob.put(key_of(1), payload_of(9))
    record_file(bob, key_of(1)).write_bytes(
        forged_for(record_file(alice, key_of(1)).read_bytes(), bob, key_of(1))
    )
    assert bob.get(key_of(1)) is None
    assert bob.stats().corrupt == {"auth": 1}


def forged_for(record: bytes, store: DiskStore, key: bytes) -> bytes:
    digest = store.namespace.digest()
    header = decode_header(record[:HEADER_BYTES], digest, header_key(record))
    name = store._sealer.name(digest, key)  # type: ignore[union-attr]
    return encode_header(dataclasses.replace(header, key=name)) + record[HEADER_BYTES:]


def test_rotation_across_a_restart_reads_old_records_and_writes_new_ones(
    open_disk: Callable[..., DiskStore],
) -> None:
    before = open_disk(sealer=sealer_of(KEY_A))
    before.put(key_of(1), payload_of(1))
    before.close()
    after = open_disk(sealer=sealer_of(KEY_B, KEY_A))
    assert after.get(key_of(1)) == payload_of(1)
    after.put(key_of(2), payload_of(2))
    after.close()
    only_new = open_disk(sealer=sealer_of(KEY_B))
    assert only_new.get(key_of(2)) == payload_of(2)
    assert not only_new.contains(key_of(1)), "the retired key's names are not looked up"


def test_gc_drops_the_records_only_a_retired_key_reads(
    open_disk: Callable[..., DiskStore], root: Path
) -> None:
    old = open_disk(sealer=sealer_of(KEY_A))
    old.put(key_of(1), payload_of(1))
    old.put(key_of(2), payload_of(2))
    old.close()
    rotated = sealer_of(KEY_B, KEY_A)
    store = open_disk(sealer=rotated)
    store.put(key_of(3), payload_of(3))
    result = collect(root, keep_key_ids={MasterKey(KEY_B).key_id})
    assert result.records == 2
    store.refresh()
    assert store.get(key_of(3)) == payload_of(3)
    assert not store.contains(key_of(1)) and not store.contains(key_of(2))
    assert store.verify() == []


def test_verify_with_the_key_authenticates_and_without_counts_what_it_could_not(
    open_disk: Callable[..., DiskStore], root: Path
) -> None:
    sealer = sealer_of()
    store = open_disk(sealer=sealer)
    for i in range(3):
        store.put(key_of(i), payload_of(i))
    assert store.verify() == []
    unopened: list[bytes] = []
    keyless = DiskStore(root, store.namespace, free_space_floor_bytes=0)
    try:
        assert keyless.verify(unopened=unopened.append) == []
        assert unopened == [MasterKey(KEY_A).key_id] * 3
        # The keyless store serves none of them, and quarantines nothing.
        assert keyless.keys() and all(keyless.get(k) is None for k in list(keyless.keys())[:1])
    finally:
        keyless.close()


def test_verify_with_the_key_reports_a_forged_record_and_fix_leaves_it(
    open_disk: Callable[..., DiskStore],
) -> None:
    store = open_disk(sealer=sealer_of())
    store.put(key_of(1), payload_of(1))
    store.put(key_of(2), payload_of(2))
    path = record_file(store, key_of(2))
    path.write_bytes(forged_for(record_file(store, key_of(1)).read_bytes(), store, key_of(2)))
    problems = store.verify(fix=True)
    # It cannot be told from another tenant's record: reported, never quarantined by verify.
    assert [(p.kind, p.detail.split(":")[0], p.fixed) for p in problems] == [
        ("unauthenticated", "auth", False)
    ]
    assert path.exists() and store.get(key_of(2)) is None, "a load quarantines it"


def test_a_plain_store_and_a_sealed_one_use_separate_namespaces(
    open_disk: Callable[..., DiskStore],
) -> None:
    plain = open_disk()
    sealed = open_disk(sealer=sealer_of())
    assert plain.namespace_dir != sealed.namespace_dir
    plain.put(key_of(1), payload_of(1))
    assert sealed.get(key_of(1)) is None and sealed.stats().corrupt == {}


def test_puts_stay_page_aligned_for_direct_writes(open_disk: Callable[..., DiskStore]) -> None:
    store = open_disk(sealer=sealer_of())
    assert store.put(key_of(1), payload_of(1))
    assert os.path.getsize(record_file(store, key_of(1))) == HEADER_BYTES + len(payload_of(1))


class _RowWatch:
    """Wraps a sealer's ``open`` and notes, for each call that writes into one of the watched
    rows, the state its load was in: a row may change only while its load is claimed and
    copying, never once written (the scheduler may abandon it then, and vLLM reuse the row)."""

    def __init__(self, sealer: RecordSealer, rows: list[memoryview], loads: list[Any]) -> None:
        self._open, self.rows, self.loads = sealer.open, rows, loads
        self.states: list[LoadState] = []
        sealer.open = self  # type: ignore[method-assign]

    def __call__(self, header: Any, ciphertext: Any, out: memoryview) -> None:
        target = address_of(memoryview(out))
        for row, load in zip(self.rows, self.loads, strict=True):
            if address_of(row) == target:
                self.states.append(load.state)
        self._open(header, ciphertext, out)


@pytest.mark.skipif(native.record_reader() is None, reason="kvtier.native._recordread not built")
@pytest.mark.parametrize("writes", ["cached", "direct"])
@pytest.mark.parametrize("reads", ["one", "list"])
def test_a_sealed_record_is_opened_before_its_row_is_written_never_in_the_row_after(
    open_disk: Callable[..., DiskStore], writes: str, reads: str
) -> None:
    sealer = sealer_of()
    io = None
    if writes == "cached":  # the page cache keeps the records: read straight into the row
        io = RecordIO(RecordWriter(fsync="data", direct_writes=False, drop_written_pages=False))
    store = open_disk(sealer=sealer, **({"io": io} if io else {}))
    for n in (1, 2):
        assert store.put(key_of(n), payload_of(n))
    rows = [aligned_buffer(PAYLOAD_BYTES) for _ in (1, 2)]
    loads = [AbandonableLoad(), AbandonableLoad()]
    watch = _RowWatch(sealer, rows, loads)
    bounce = aligned_buffer(PAYLOAD_BYTES)
    keys = [key_of(1), key_of(2)]
    if reads == "one":
        loaded = [
            store.get_into_when(k, r, c, bounce) for k, r, c in zip(keys, rows, loads, strict=True)
        ]
    else:
        loaded = store.get_many_into_when(keys, rows, loads, bounce)
    assert loaded == [True, True] and [bytes(r) for r in rows] == [payload_of(1), payload_of(2)]
    assert all(state is LoadState.COPYING for state in watch.states), watch.states
