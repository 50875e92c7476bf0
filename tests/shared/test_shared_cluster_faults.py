"""A Cluster master dies: its keys miss fast, keys on the live masters keep working.

The test owns its Cluster (it kills a node), so it pays the ~3 s of cluster set-up.
"""

from __future__ import annotations

import time

from redis.cluster import RedisCluster

from kvtier.store.shared import KEY_PREFIX
from tests.support.redis_servers import RedisClusterServers
from tests.support.shared_store import open_shared
from tests.support.store import key_of, make_namespace, payload_of
from tests.support.waiting import wait_until

OP_TIMEOUT_S = 0.5
OP_BOUND_S = 2 * OP_TIMEOUT_S + 2.0


def test_killed_master_misses_its_keys_while_live_masters_serve(
    fresh_cluster: RedisClusterServers,
) -> None:
    namespace = make_namespace()
    store = open_shared(
        fresh_cluster.url, namespace, op_timeout_s=OP_TIMEOUT_S, connect_timeout_s=0.3,
        breaker_base_s=0.2, breaker_max_s=1.0,
    )  # fmt: skip
    with store:
        keys = [key_of(i) for i in range(60)]
        assert all(store.put(k, payload_of(i)) for i, k in enumerate(keys))
        probe = RedisCluster(host="127.0.0.1", port=fresh_cluster.nodes[0].port)
        victim = fresh_cluster.nodes[1]
        prefix = KEY_PREFIX + namespace.digest_hex().encode() + b":"
        on_victim = {
            k
            for k in keys
            if probe.get_node_from_key(prefix + k.hex().encode()).port == victim.port
        }
        probe.close()
        assert 0 < len(on_victim) < len(keys)
        victim.kill()

        for i, key in enumerate(keys):
            start = time.monotonic()
            got = store.get(key)
            assert time.monotonic() - start < OP_BOUND_S
            assert got == (None if key in on_victim else payload_of(i))
        live = next(k for k in keys if k not in on_victim)
        assert store.put(live, payload_of(99))
        assert store.get(live) == payload_of(99)
        assert store.stats().breaker_openings >= 1

        victim.start()  # empty, but it keeps its slots (nodes.conf in its folder)
        fresh_cluster.wait_ok()
        back = next(iter(on_victim))
        assert wait_until(lambda: store.put(back, payload_of(7)), timeout_s=15)
        assert store.get(back) == payload_of(7)


def test_frozen_master_opens_only_its_own_breaker_and_recovers_after_sigcont(
    fresh_cluster: RedisClusterServers,
) -> None:
    store = open_shared(
        fresh_cluster.url, make_namespace(), op_timeout_s=OP_TIMEOUT_S, connect_timeout_s=0.3,
        breaker_base_s=0.2, breaker_max_s=1.0,
    )  # fmt: skip
    with store:
        keys = [key_of(i) for i in range(30)]
        assert all(store.put(k, payload_of(i)) for i, k in enumerate(keys))
        frozen = fresh_cluster.nodes[2]
        frozen.pause()
        try:
            start = time.monotonic()
            hits = [store.get(k) == payload_of(i) for i, k in enumerate(keys)]
            # One timeout (two attempts) opens the node's breaker; its other keys skip I/O.
            assert time.monotonic() - start < OP_BOUND_S + 2.0
            assert 0 < sum(hits) < len(keys)
            stats = store.stats()
            assert stats.breaker_openings == 1 and stats.breaker_skips >= 1
        finally:
            frozen.resume()
        assert wait_until(
            lambda: all(store.get(k) == payload_of(i) for i, k in enumerate(keys)), timeout_s=15
        )
        assert store.stats().reconnects == 1
