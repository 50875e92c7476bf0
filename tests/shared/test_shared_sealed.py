"""SharedStore with sealed values: the contract on a real server, keys that reveal no block
hash, and tampered, planted or foreign values refused, deleted and counted."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import pytest
import redis

from kvtier.format import HEADER_BYTES, Namespace
from kvtier.format.record import decode_header, encode_header
from kvtier.format.sealing import KeyRing, MasterKey, RecordSealer
from kvtier.store import BlockStore, DiskStore
from kvtier.store.shared import KEY_PREFIX, SharedStore
from kvtier.store.tiered import LocalThenShared
from tests.shared.test_shared_contract import _SharedContract
from tests.support.redis_servers import RedisClusterServers, RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import PAYLOAD_BYTES, key_of, payload_of

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))
TRIED = 256


def sealer_of(*secrets: bytes, tenant: str | None = None) -> RecordSealer:
    return KeyRing([MasterKey(s) for s in secrets or (KEY_A,)]).tenant(tenant)


def server_values(store: SharedStore) -> dict[bytes, bytes]:
    """Server key -> value of every value under the store's prefix, read with redis-py."""
    client = store._client
    prefix = KEY_PREFIX + store.namespace.digest_hex().encode() + b":"
    found = {}
    for server_key in client.scan_iter(match=prefix + b"*", count=1000):
        value = client.get(server_key)
        if value is not None:
            found[server_key] = value
    return found


class TestSealedSharedStandalone(_SharedContract):
    @pytest.fixture(autouse=True)
    def _bind(
        self, redis_standalone: RedisServer, unique_namespace: Callable[[], Namespace]
    ) -> object:
        self.url = redis_standalone.url
        self.new_namespace = unique_namespace
        self._sealer = sealer_of()
        self._opened: list[SharedStore] = []
        yield
        for store in self._opened:
            store.close()

    def make_store(self, records: int = 8) -> BlockStore:
        store = open_shared(
            self.url,
            self.new_namespace(),
            self._sealer,
            max_record_bytes=records * self.record_bytes(PAYLOAD_BYTES),
            view_max_keys=records,
        )
        self._opened.append(store)
        return store

    def ground_truth(self, store: BlockStore) -> dict[bytes, bytes]:
        """The server's values opened with the sealer alone; names mapped back to the tests'
        block keys (``key_of(i)``, i < TRIED)."""
        assert isinstance(store, SharedStore)
        digest = store.namespace.digest()
        by_name = {self._sealer.name(digest, key_of(i)): key_of(i) for i in range(TRIED)}
        prefix = KEY_PREFIX + store.namespace.digest_hex().encode() + b":"
        truth = {}
        for server_key, value in server_values(store).items():
            name = bytes.fromhex(server_key[len(prefix) :].decode())
            header = decode_header(value, digest, name, len(value) - HEADER_BYTES)
            out = memoryview(bytearray(header.payload_len))
            self._sealer.open(header, value[HEADER_BYTES:], out)
            truth[by_name[name]] = bytes(out)
        return truth


@pytest.fixture
def shared(redis_standalone: RedisServer, unique_namespace: Callable[[], Namespace]) -> object:
    opened: list[SharedStore] = []
    namespace = unique_namespace()

    def open_store(sealer: RecordSealer | None) -> SharedStore:
        store = open_shared(redis_standalone.url, namespace, sealer)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def hashlike(i: int) -> bytes:
    return hashlib.sha256(i.to_bytes(4, "big")).digest() + bytes(4)


def test_no_server_key_or_value_holds_a_block_hash(shared) -> None:  # type: ignore[no-untyped-def]
    store = shared(sealer_of())
    keys = [hashlike(i) for i in range(5)]
    for i, key in enumerate(keys):
        assert store.put(key, payload_of(i))
    values = server_values(store)
    assert len(values) == 5
    blob = b"".join(values) + b"".join(values.values())
    for key in keys:
        for form in (key, key[:32]):
            assert form not in blob and form.hex().encode() not in blob


def test_a_flipped_bit_is_a_miss_and_the_value_is_deleted(shared) -> None:  # type: ignore[no-untyped-def]
    store = shared(sealer_of())
    store.put(key_of(1), payload_of(1))
    ((server_key, value),) = server_values(store).items()
    damaged = bytearray(value)
    damaged[HEADER_BYTES + 3] ^= 0x01
    store._client.set(server_key, bytes(damaged))
    assert store.get(key_of(1)) is None
    assert store.stats().corrupt == {"auth": 1} and store.stats().corrupt_deleted == 1
    assert server_values(store) == {}


def test_two_tenants_never_restore_each_others_blocks(shared) -> None:  # type: ignore[no-untyped-def]
    ring = KeyRing([MasterKey(KEY_A)])
    alice, bob = shared(ring.tenant("alice")), shared(ring.tenant("bob"))
    assert alice.put(key_of(1), payload_of(1))
    assert bob.exists_many([key_of(1)]) == set()
    assert bob.get_into(key_of(1), memoryview(bytearray(PAYLOAD_BYTES))) is False
    # Alice's value planted under Bob's name for the block: refused by the tag, deleted.
    ((_, value),) = server_values(alice).items()
    digest = bob.namespace.digest()
    name_a = ring.tenant("alice").name(digest, key_of(1))
    name_b = ring.tenant("bob").name(digest, key_of(1))
    header = decode_header(value, digest, name_a)
    planted = encode_header(dataclasses.replace(header, key=name_b)) + value[HEADER_BYTES:]
    bob._client.set(bob._server_key(name_b), planted)
    assert bob.get_into(key_of(1), memoryview(bytearray(PAYLOAD_BYTES))) is False
    assert bob.stats().corrupt == {"auth": 1}
    assert alice.get(key_of(1)) == payload_of(1)


def test_a_replica_finds_values_written_under_an_older_key(shared) -> None:  # type: ignore[no-untyped-def]
    before = shared(sealer_of(KEY_A))
    before.put(key_of(1), payload_of(1))
    after = shared(sealer_of(KEY_B, KEY_A))
    assert after.exists_many([key_of(1), key_of(2)]) == {key_of(1)}
    assert after.get(key_of(1)) == payload_of(1), "found by exists_many, read by the old name"
    assert after.put(key_of(2), payload_of(2))
    assert shared(sealer_of(KEY_B)).exists_many([key_of(1), key_of(2)]) == {key_of(2)}


def test_verify_without_the_key_deletes_nothing(shared) -> None:  # type: ignore[no-untyped-def]
    sealed = shared(sealer_of())
    sealed.put(key_of(1), payload_of(1))
    sealed.put(key_of(2), payload_of(2))
    keyless = open_shared(sealed.config.url, sealed.namespace)
    try:
        assert keyless.verify(fix=True) == []
        assert keyless.get(key_of(1)) is None
    finally:
        keyless.close()
    assert len(server_values(sealed)) == 2
    assert sealed.verify() == []


def test_a_plain_store_reads_nothing_of_a_sealed_one(shared) -> None:  # type: ignore[no-untyped-def]
    sealed = shared(sealer_of())
    plain = shared(None)
    assert sealed.namespace != plain.namespace
    sealed.put(key_of(1), payload_of(1))
    assert plain.get(key_of(1)) is None and plain.stats().corrupt == {}
    assert redis.Redis  # the plain client is what ground truth reads with


class TestSealedSharedCluster(TestSealedSharedStandalone):
    @pytest.fixture(autouse=True)
    def _bind(  # type: ignore[override]
        self, redis_cluster: RedisClusterServers, unique_namespace: Callable[[], Namespace]
    ) -> object:
        self.url = redis_cluster.url
        self.new_namespace = unique_namespace
        self._sealer = sealer_of()
        self._opened: list[SharedStore] = []
        yield
        for store in self._opened:
            store.close()


def test_tenant_views_of_one_store_keep_each_tenants_values_apart(shared) -> None:  # type: ignore[no-untyped-def]
    ring = KeyRing([MasterKey(KEY_A)])
    store = shared(ring.tenant(None))
    alice, bob = store.tenant_view(ring.tenant("alice")), store.tenant_view(ring.tenant("bob"))
    assert store.tenant_view(ring.tenant(None)) is store
    assert alice.put(key_of(1), payload_of(1))
    assert not bob.contains(key_of(1)) and bob.exists_many([key_of(1)]) == set()
    assert store.exists_many([key_of(1)]) == set(), "nor the default tenant"
    assert bob.put(key_of(1), payload_of(2))
    assert alice.get(key_of(1)) == payload_of(1) and bob.get(key_of(1)) == payload_of(2)
    assert list(alice.keys()) == [key_of(1)] and list(store.keys()) == []
    assert len(server_values(store)) == 2, "one prefix, one value per tenant"
    # Alice's value planted under Bob's name for the block: refused by the tag, deleted.
    digest = store.namespace.digest()
    name_a = ring.tenant("alice").name(digest, key_of(1))
    name_b = ring.tenant("bob").name(digest, key_of(1))
    value = store._client.get(store._server_key(name_a))
    header = decode_header(value, digest, name_a)
    planted = encode_header(dataclasses.replace(header, key=name_b)) + value[HEADER_BYTES:]
    store._client.set(store._server_key(name_b), planted)
    assert bob.get_into(key_of(1), memoryview(bytearray(PAYLOAD_BYTES))) is False
    assert store.stats().corrupt == {"auth": 1} and store.stats().corrupt_deleted == 1
    assert alice.get(key_of(1)) == payload_of(1)


def test_verify_as_one_tenant_keeps_other_tenants_values(shared) -> None:  # type: ignore[no-untyped-def]
    ring = KeyRing([MasterKey(KEY_A)])
    store = shared(ring.tenant(None))
    alice = store.tenant_view(ring.tenant("alice"))
    alice.put(key_of(1), payload_of(1))
    store.put(key_of(2), payload_of(2))
    assert [p.kind for p in store.verify(fix=True)] == ["unauthenticated"]
    assert alice.verify() != [] and len(server_values(store)) == 2
    assert alice.get(key_of(1)) == payload_of(1)


def test_a_tenant_view_of_disk_then_shared_writes_back_under_the_tenants_keys(
    shared, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    ring = KeyRing([MasterKey(KEY_A)])
    server = shared(ring.tenant(None))
    disk = DiskStore(tmp_path, server.namespace, free_space_floor_bytes=0, sealer=ring.tenant(None))
    store = LocalThenShared(disk, server)
    try:
        alice = store.tenant_view(ring.tenant("alice"))
        assert server.tenant_view(ring.tenant("alice")).put(key_of(1), payload_of(1))
        assert alice.exists_many([key_of(1)]) == {key_of(1)}
        assert store.exists_many([key_of(1)]) == set(), "the default tenant's names differ"
        assert alice.get(key_of(1)) == payload_of(1)
        store.wait_write_back()
        assert store.written_back == 1
        assert disk.tenant_view(ring.tenant("alice")).get(key_of(1)) == payload_of(1)
        assert not disk.contains(key_of(1))
        alice.close()  # a view closes nothing
        assert store.get(key_of(2)) is None and alice.get(key_of(1)) == payload_of(1)
    finally:
        store.close()
