"""Replicas of one namespace share values; different namespaces never see each other's."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kvtier.format import Namespace
from kvtier.store.shared import SharedStore
from tests.support.redis_servers import RedisClusterServers, RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import PAYLOAD_BYTES, key_of, payload_of


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest, server_of_kind: str) -> str:
    # server_of_kind (parametrized by server kind) is named so that the kind is part of the
    # test's parameters; the servers below are looked up by name.
    if request.param == "standalone":
        server: RedisServer = request.getfixturevalue("redis_standalone")
        return server.url
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    return cluster.url


@pytest.fixture
def open_store(url: str) -> Iterator[Callable[[Namespace], SharedStore]]:
    opened: list[SharedStore] = []

    def open_(namespace: Namespace) -> SharedStore:
        store = open_shared(url, namespace)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def test_two_namespaces_on_one_server_never_see_each_others_values(
    open_store: Callable[[Namespace], SharedStore], unique_namespace: Callable[[], Namespace]
) -> None:
    a, b = open_store(unique_namespace()), open_store(unique_namespace())
    assert a.put(key_of(1), payload_of(1))
    assert b.get(key_of(1)) is None
    assert b.exists_many([key_of(1)]) == set()
    assert b.put(key_of(1), payload_of(2))
    assert a.get(key_of(1)) == payload_of(1) and b.get(key_of(1)) == payload_of(2)
    assert a.stats().corrupt == {} and b.stats().corrupt == {}


def test_replica_learns_another_replicas_puts_through_exists_many(
    open_store: Callable[[Namespace], SharedStore], unique_namespace: Callable[[], Namespace]
) -> None:
    namespace = unique_namespace()
    writer, reader = open_store(namespace), open_store(namespace)
    for i in range(50):
        writer.put(key_of(i), payload_of(i))
    assert not reader.contains(key_of(3))
    wanted = [key_of(i) for i in range(0, 100, 3)]
    assert reader.exists_many(wanted) == {key_of(i) for i in range(0, 50, 3)}
    assert reader.contains(key_of(3)) and reader.payload_len(key_of(3)) == PAYLOAD_BYTES
    assert not reader.contains(key_of(51))
    assert reader.get(key_of(3)) == payload_of(3)


def test_exists_many_forgets_keys_the_server_no_longer_holds(
    open_store: Callable[[Namespace], SharedStore], unique_namespace: Callable[[], Namespace]
) -> None:
    namespace = unique_namespace()
    a, b = open_store(namespace), open_store(namespace)
    a.put(key_of(1), payload_of(1))
    b.exists_many([key_of(1)])
    a.delete(key_of(1))
    assert b.contains(key_of(1))
    assert b.refresh() == 1
    assert not b.contains(key_of(1))


def test_store_from_options_mapping_round_trips(
    url: str, unique_namespace: Callable[[], Namespace]
) -> None:
    with SharedStore.from_options({"url": url, "op_timeout_s": 1.0}, unique_namespace()) as store:
        assert store.config.op_timeout_s == 1.0
        assert store.put(key_of(1), payload_of(1)) and store.get(key_of(1)) == payload_of(1)


def test_refresh_sweeps_the_view_in_bounded_batches(
    open_store: Callable[[Namespace], SharedStore], unique_namespace: Callable[[], Namespace]
) -> None:
    from kvtier.store.shared.store import REFRESH_BATCH

    namespace = unique_namespace()
    a, b = open_store(namespace), open_store(namespace)
    keys = [key_of(i) for i in range(REFRESH_BATCH + 10)]
    for k in keys:
        a.put(k, b"x" * 64)
    doomed = keys[:5] + keys[-5:]
    b.exists_many(keys)
    b.exists_many(doomed)  # now the newest in b's view
    for k in doomed:
        a.delete(k)
    assert b.refresh() == 0  # checks only the REFRESH_BATCH oldest: all still there
    assert b.refresh() == 10  # then the rest, the keys found having become the newest
    assert sorted(b.keys()) == sorted(keys[5:-5])
