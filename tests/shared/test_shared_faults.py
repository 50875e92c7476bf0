"""Server faults at the store boundary: every one is a miss or False, in bounded time.

Each test owns its server (``fresh_server``), since it kills, freezes or restarts it. Bounds
are generous multiples of the configured timeouts, never measured wall times.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import pytest

from kvtier.errors import ConfigError
from kvtier.store.shared import SharedStore
from tests.support.redis_servers import RedisServer, free_port
from tests.support.shared_store import open_shared
from tests.support.store import PAYLOAD_BYTES, key_of, make_namespace, payload_of
from tests.support.waiting import wait_until

OP_TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 0.3
# One op may take a connect or reply timeout per attempt (retries=1: two attempts) plus slack.
OP_BOUND_S = 2 * max(OP_TIMEOUT_S, CONNECT_TIMEOUT_S) + 2.0


@pytest.fixture
def open_store() -> Iterator[Callable[[str], SharedStore]]:
    opened: list[SharedStore] = []

    def open_(url: str) -> SharedStore:
        store = open_shared(
            url,
            make_namespace(),
            connect_timeout_s=CONNECT_TIMEOUT_S,
            op_timeout_s=OP_TIMEOUT_S,
            retries=1,
            breaker_base_s=0.2,
            breaker_max_s=1.0,
        )
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.monotonic()
    result = fn()
    return result, time.monotonic() - start


def test_unreachable_server_at_start_up_raises_config_error_naming_the_url() -> None:
    port = free_port()
    with pytest.raises(ConfigError, match=f"url=redis://127.0.0.1:{port} .*start the server"):
        open_shared(f"redis://127.0.0.1:{port}", make_namespace(), connect_timeout_s=0.3)


@pytest.mark.client_side
def test_killed_server_turns_every_op_into_a_miss_in_bounded_time(
    fresh_server: Callable[..., RedisServer], open_store: Callable[[str], SharedStore]
) -> None:
    server = fresh_server()
    store = open_store(server.url)
    assert store.put(key_of(1), payload_of(1))
    server.kill()
    out = memoryview(bytearray(PAYLOAD_BYTES))
    for op in (
        lambda: store.get_into(key_of(1), out),
        lambda: store.put(key_of(2), payload_of(2)),
        lambda: store.delete(key_of(1)),
        lambda: bool(store.exists_many([key_of(1), key_of(2)])),
    ):
        result, elapsed = timed(op)
        assert result is False
        assert elapsed < OP_BOUND_S
    stats = store.stats()
    assert stats.breaker_openings == 1
    assert stats.errors.get("connection", 0) >= 1
    assert stats.misses == 1 and stats.put_failures == 1


def test_restarted_empty_server_misses_then_takes_puts_with_the_same_store(
    fresh_server: Callable[..., RedisServer], open_store: Callable[[str], SharedStore]
) -> None:
    server = fresh_server()
    store = open_store(server.url)
    assert store.put(key_of(1), payload_of(1))
    server.restart()
    assert store.get(key_of(1)) is None
    assert not store.contains(key_of(1))
    assert wait_until(lambda: store.put(key_of(2), payload_of(2)), timeout_s=10)
    assert store.get(key_of(2)) == payload_of(2)


@pytest.mark.client_side
def test_restart_after_breaker_opened_recovers_without_a_new_store(
    fresh_server: Callable[..., RedisServer], open_store: Callable[[str], SharedStore]
) -> None:
    server = fresh_server()
    store = open_store(server.url)
    server.kill()
    assert not store.put(key_of(1), payload_of(1))
    assert store.stats().breaker_openings == 1
    server.start()
    assert wait_until(lambda: store.put(key_of(1), payload_of(1)), timeout_s=10)
    assert store.get(key_of(1)) == payload_of(1)
    assert store.stats().reconnects == 1


@pytest.mark.client_side
def test_frozen_server_times_out_opens_the_breaker_and_recovers_after_sigcont(
    fresh_server: Callable[..., RedisServer], open_store: Callable[[str], SharedStore]
) -> None:
    server = fresh_server()
    store = open_store(server.url)
    assert store.put(key_of(1), payload_of(1))
    server.pause()
    try:
        result, elapsed = timed(lambda: store.get(key_of(1)))
        assert result is None
        assert elapsed < OP_BOUND_S
        stats = store.stats()
        assert stats.breaker_openings == 1 and stats.errors.get("timeout", 0) >= 1
        # While open, ops are refused without touching the frozen server.
        assert not store.put(key_of(2), payload_of(2))
        assert store.stats().breaker_skips >= 1
    finally:
        server.resume()
    assert wait_until(lambda: store.get(key_of(1)) == payload_of(1), timeout_s=10)
    assert store.stats().reconnects == 1


def test_server_full_with_noeviction_fails_puts_counted_and_warned_at_start_up(
    fresh_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_server(maxmemory_bytes=6 * 2**20, maxmemory_policy="noeviction")
    payload_len = 256 * 1024
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        store = open_shared(server.url, make_namespace(block_bytes=payload_len))
    assert "noeviction" in caplog.text
    with store:
        results = [store.put(key_of(i), payload_of(i, payload_len)) for i in range(40)]
        stats = store.stats()
        assert results[0] and not results[-1]
        assert stats.put_failures == results.count(False)
        assert stats.errors["oom"] == results.count(False)
        assert stats.breaker_openings == 0  # the server answered: it is full, not down
        assert store.get(key_of(0)) == payload_of(0, payload_len)


def test_record_over_the_cap_is_refused_without_io(
    redis_standalone: RedisServer,
) -> None:
    with open_shared(redis_standalone.url, make_namespace(), max_record_bytes=64 * 1024) as store:
        assert not store.put(key_of(1), bytes(64 * 1024))
        assert store.stats().errors == {"too_large": 1}
        assert store.exists_many([key_of(1)]) == set()


def test_namespace_whose_records_exceed_the_server_cap_is_refused_at_start_up(
    fresh_server: Callable[..., RedisServer],
) -> None:
    server = fresh_server(maxmemory_bytes=8 * 2**20)
    with pytest.raises(ConfigError, match=r"over the record cap.*raise the server's maxmemory"):
        open_shared(server.url, make_namespace(block_bytes=2 * 2**20))


def test_refresh_with_the_server_down_forgets_nothing(
    fresh_server: Callable[..., RedisServer], open_store: Callable[[str], SharedStore]
) -> None:
    server = fresh_server()
    store = open_store(server.url)
    assert store.put(key_of(1), payload_of(1))
    server.kill()
    assert store.refresh() == 0
    assert store.contains(key_of(1))
