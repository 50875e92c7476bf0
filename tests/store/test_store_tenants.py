"""Tenants of one sealed disk store: each tenant's records named and sealed under its own keys
(``tenant_view``), in one folder, one index, one cap and one eviction order; another
tenant's lookup never finds them, and a record copied under another tenant's name fails
authentication, a miss, quarantined and counted."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from kvtier.dataplane.abandonable import AbandonableLoad
from kvtier.format import HEADER_BYTES
from kvtier.format.record import decode_header, encode_header
from kvtier.format.sealing import KeyRing, MasterKey
from kvtier.store import DiskStore, MemoryStore
from kvtier.store.disk.index import charge
from kvtier.store.tenant_view import TenantView
from tests.support.store import PAYLOAD_BYTES, aligned_buffer, key_of, payload_of

RING = KeyRing([MasterKey(bytes(range(32)))])


def header_key(record: bytes) -> bytes:
    return record[48 : 48 + int.from_bytes(record[14:16], "little")]


def record_file(store: DiskStore, view: TenantView, key: bytes) -> bytes:
    """The bytes of ``key``'s record as the view's tenant stored it."""
    name = view.sealer.name(store.namespace.digest(), key)
    (path,) = [p for p in store.namespace_dir.glob("blocks/*/*") if p.name.startswith(name.hex())]
    return path.read_bytes()


@pytest.fixture
def store(open_disk: Callable[..., DiskStore]) -> DiskStore:
    return open_disk(records=16, sealer=RING.tenant(None))


def views(store: DiskStore, *salts: str) -> list[TenantView]:
    made = [store.tenant_view(RING.tenant(salt)) for salt in salts]
    assert all(isinstance(v, TenantView) for v in made)
    return made  # type: ignore[return-value]


def test_the_default_tenants_view_is_the_store_itself(store: DiskStore) -> None:
    assert store.tenant_view(RING.tenant(None)) is store


def test_each_tenant_finds_only_its_own_record_of_a_block(store: DiskStore) -> None:
    alice, bob = views(store, "alice", "bob")
    assert alice.put(key_of(1), payload_of(1))
    assert not bob.contains(key_of(1)) and bob.get(key_of(1)) is None
    assert not store.contains(key_of(1)), "nor does the default tenant"
    assert bob.put(key_of(1), payload_of(2))
    assert alice.get(key_of(1)) == payload_of(1) and bob.get(key_of(1)) == payload_of(2)
    assert list(alice.keys()) == [key_of(1)] and list(bob.keys()) == [key_of(1)]
    assert list(store.keys()) == []
    assert store.stats().corrupt == {}, "a lookup under another name touches no record"


def test_tenants_share_one_cap_one_eviction_order_and_one_count(
    open_disk: Callable[..., DiskStore],
) -> None:
    store = open_disk(records=6, sealer=RING.tenant(None))
    alice, bob = views(store, "alice", "bob")
    for i in range(12):
        assert (alice if i % 2 else bob).put(key_of(i), payload_of(i))
        assert store.footprint_bytes() <= store.capacity_bytes
    assert store.stats().puts == 12 and store.stats().evictions > 0
    assert store.used_bytes() == alice.used_bytes() == bob.used_bytes()
    held = [i for i in range(12) if (alice if i % 2 else bob).contains(key_of(i))]
    assert 0 < len(held) < 12
    assert all(i >= 12 - len(held) - 2 for i in held), "the oldest went first, whoever's"
    assert store.used_bytes() >= len(held) * charge(HEADER_BYTES + PAYLOAD_BYTES)


def test_a_tenants_record_copied_under_another_tenants_name_is_a_quarantined_miss(
    store: DiskStore,
) -> None:
    alice, bob = views(store, "alice", "bob")
    alice.put(key_of(1), payload_of(1))
    bob.put(key_of(1), payload_of(2))
    # Someone with write access: Alice's record over Bob's file for the same block, its
    # header rewritten to Bob's name (the header checksum is keyless, so it can be redone).
    digest = store.namespace.digest()
    data = record_file(store, alice, key_of(1))
    header = decode_header(data[:HEADER_BYTES], digest, header_key(data))
    bob_name = bob.sealer.name(digest, key_of(1))
    forged = encode_header(dataclasses.replace(header, key=bob_name)) + data[HEADER_BYTES:]
    (path,) = [
        p for p in store.namespace_dir.glob("blocks/*/*") if p.name.startswith(bob_name.hex())
    ]
    path.write_bytes(forged)
    row = aligned_buffer(PAYLOAD_BYTES)
    assert not bob.get_into_when(key_of(1), row, AbandonableLoad(), aligned_buffer(PAYLOAD_BYTES))
    assert store.stats().corrupt == {"auth": 1} and store.stats().quarantined == 1
    assert not bob.contains(key_of(1))
    assert alice.get(key_of(1)) == payload_of(1), "the original is untouched"


def test_a_tenants_list_read_opens_each_record_with_its_keys(store: DiskStore) -> None:
    (alice,) = views(store, "alice")
    for i in (1, 2, 3):
        alice.put(key_of(i), payload_of(i))
    rows = [aligned_buffer(PAYLOAD_BYTES) for _ in range(3)]
    loads = [AbandonableLoad() for _ in range(3)]
    keys = [key_of(i) for i in (1, 2, 3)]
    got = alice.get_many_into_when(keys, rows, loads, aligned_buffer(PAYLOAD_BYTES))
    assert got == [True] * 3 and [bytes(r) for r in rows] == [payload_of(i) for i in (1, 2, 3)]
    assert store.get_many_into_when(keys, rows, loads, aligned_buffer(PAYLOAD_BYTES)) == [False] * 3


def test_a_tenants_delete_leaves_another_tenants_record(store: DiskStore) -> None:
    alice, bob = views(store, "alice", "bob")
    alice.put(key_of(1), payload_of(1))
    bob.put(key_of(1), payload_of(2))
    assert bob.delete(key_of(1)) and not bob.contains(key_of(1))
    assert alice.get(key_of(1)) == payload_of(1)


def test_tenants_records_survive_a_restart_for_their_tenant_only(
    open_disk: Callable[..., DiskStore],
) -> None:
    before = open_disk(sealer=RING.tenant(None))
    (alice,) = views(before, "alice")
    alice.put(key_of(1), payload_of(1))
    before.close()
    after = open_disk(sealer=RING.tenant(None))
    alice_after, bob_after = views(after, "alice", "bob")
    assert alice_after.get(key_of(1)) == payload_of(1)
    assert bob_after.get(key_of(1)) is None and after.stats().corrupt == {}


def test_verify_as_one_tenant_counts_other_tenants_records_and_fix_keeps_them(
    store: DiskStore, open_disk: Callable[..., DiskStore]
) -> None:
    alice, bob = views(store, "alice", "bob")
    alice.put(key_of(1), payload_of(1))
    bob.put(key_of(2), payload_of(2))
    store.put(key_of(3), payload_of(3))
    others: list[bytes] = []
    assert store.verify(fix=True, unauthenticated=others.append) == []
    assert len(others) == 2, "Alice's and Bob's records: not the default tenant's"
    as_alice = open_disk(sealer=RING.tenant("alice"))
    others.clear()
    assert as_alice.verify(unauthenticated=others.append) == [] and len(others) == 2
    assert alice.get(key_of(1)) == payload_of(1) and bob.get(key_of(2)) == payload_of(2)


def test_verify_as_a_tenant_without_the_callback_reports_what_it_cannot_open(
    store: DiskStore,
) -> None:
    (alice,) = views(store, "alice")
    alice.put(key_of(1), payload_of(1))
    assert [(p.kind, p.fixed) for p in store.verify(fix=True)] == [("unauthenticated", False)]
    assert alice.get(key_of(1)) == payload_of(1)


def test_a_plain_store_has_no_tenant_view(open_disk: Callable[..., DiskStore]) -> None:
    with pytest.raises(ValueError, match="plain records"):
        open_disk().tenant_view(RING.tenant("alice"))
    with pytest.raises(ValueError, match="does not seal"):
        MemoryStore(1 << 20).tenant_view(RING.tenant("alice"))
