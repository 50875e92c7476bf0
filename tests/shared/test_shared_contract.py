"""SharedStore passes the shared store contract, on a standalone server and on a Cluster.

Each ``make_store`` gets a namespace of its own, so the session's servers need no flushing.
The store's byte cap is the server's maxmemory, not a cap of its own, so the contract's cap
tests are bound to what the shared tier does cap: one record (``max_record_bytes``) and the
in-memory view (``view_max_keys``, LRU). Server-side eviction is checked separately below.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from kvtier.format import HEADER_BYTES, Namespace
from kvtier.format.record import decode_header
from kvtier.store import BlockStore
from kvtier.store.shared import KEY_PREFIX, SharedStore
from tests.support.conformance import StoreContract
from tests.support.redis_servers import RedisClusterServers, RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import PAYLOAD_BYTES, key_of, make_namespace, payload_of


class _SharedContract(StoreContract):
    url: str
    new_namespace: Callable[[], Namespace]

    def make_store(self, records: int = 8) -> BlockStore:
        store = open_shared(
            self.url,
            self.new_namespace(),
            max_record_bytes=records * self.record_bytes(PAYLOAD_BYTES),
            view_max_keys=records,
        )
        self._opened.append(store)
        return store

    def record_bytes(self, payload_len: int) -> int:
        return HEADER_BYTES + payload_len

    def ground_truth(self, store: BlockStore) -> dict[bytes, bytes]:
        """Every value under the store's namespace prefix, read with the plain client (no
        kvtier code on the read path) and decoded with kvtier.format."""
        assert isinstance(store, SharedStore)
        client = store._client  # redis-py's own client: SCAN and GET, no verification
        prefix = KEY_PREFIX + store.namespace.digest_hex().encode() + b":"
        truth: dict[bytes, bytes] = {}
        for server_key in client.scan_iter(match=prefix + b"*", count=1000):
            value = client.get(server_key)
            if value is None:
                continue
            key = bytes.fromhex(server_key[len(prefix) :].decode())
            header = decode_header(value, store.namespace.digest(), key)
            assert header.payload_len == len(value) - HEADER_BYTES
            truth[key] = bytes(value[HEADER_BYTES:])
        return truth

    def assert_truth(self, store: BlockStore, expected: dict[bytes, bytes | None]) -> None:
        """As the contract's, except that the server may hold more keys than the store's
        in-memory view lists (the view is an LRU of what this process stored or found)."""
        truth = self.ground_truth(store)
        assert set(store.keys()) <= set(truth)
        for key, payload in expected.items():
            assert truth.get(key) == payload, key.hex()[:16]
        for key, payload in truth.items():  # sized reads: a key out of the view has no length
            assert self.read(store, key, len(payload)) == payload, key.hex()[:16]

    def test_least_recently_used_is_evicted_first(self) -> None:
        """Replaces the contract's: the in-memory view drops its least recently used key;
        the server (which evicts by its own policy) still serves it."""
        store = self.make_store(records=4)
        for i in range(4):
            store.put(key_of(i), payload_of(i))
        assert self.read(store, key_of(0)) == payload_of(0)
        store.put(key_of(4), payload_of(4))
        assert store.contains(key_of(0)) and store.contains(key_of(4))
        assert not store.contains(key_of(1))
        self.assert_truth(store, {key_of(0): payload_of(0), key_of(1): payload_of(1)})

    def test_cap_is_never_exceeded(self) -> None:
        """Replaces the contract's: the view stays under its key bound; the server evicts,
        not the store, so nothing is counted as this store's eviction."""
        store = self.make_store(records=4)
        for i in range(60):
            assert store.put(key_of(i), payload_of(i, [1024, 4096, PAYLOAD_BYTES][i % 3]))
            assert len(list(store.keys())) <= 4
            assert store.used_bytes() <= 4 * self.record_bytes(PAYLOAD_BYTES)
        assert store.stats().evictions == 0
        # Keys that left the view are still on the server: a lookup finds them again.
        assert self.read(store, key_of(0), 1024) == payload_of(0, 1024)


class TestSharedStandalone(_SharedContract):
    @pytest.fixture(autouse=True)
    def _bind(
        self, redis_standalone: RedisServer, unique_namespace: Callable[[], Namespace]
    ) -> object:
        self.url = redis_standalone.url
        self.new_namespace = unique_namespace
        self._opened: list[SharedStore] = []
        yield
        for store in self._opened:
            store.close()


class TestSharedCluster(_SharedContract):
    @pytest.fixture(autouse=True)
    def _bind(
        self, redis_cluster: RedisClusterServers, unique_namespace: Callable[[], Namespace]
    ) -> object:
        self.url = redis_cluster.url
        self.new_namespace = unique_namespace
        self._opened: list[SharedStore] = []
        yield
        for store in self._opened:
            store.close()


def test_server_evicts_old_records_and_lookups_miss_cleanly(
    fresh_server: Callable[..., RedisServer],
) -> None:
    """allkeys-lru: puts never fail when full; evicted keys are plain misses, never errors."""
    server = fresh_server(maxmemory_bytes=8 * 2**20)
    payload_len = 256 * 1024
    with open_shared(server.url, make_namespace(block_bytes=payload_len)) as store:
        for i in range(80):  # 20 MiB of records into an 8 MiB server
            assert store.put(key_of(i), payload_of(i, payload_len))
        hits = sum(store.get(key_of(i)) == payload_of(i, payload_len) for i in range(80))
        stats = store.stats()
    assert 0 < hits < 80
    assert stats.misses == 80 - hits and stats.corrupt == {} and stats.put_failures == 0
    info = redis.Redis(port=server.port).info("memory")
    assert info["used_memory"] <= info["maxmemory"] + payload_len + HEADER_BYTES
