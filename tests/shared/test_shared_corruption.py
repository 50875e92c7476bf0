"""Values that fail verification are missed, deleted on the server and counted by reason.

Values are planted with a plain redis-py client, bypassing the store (the ground truth).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from kvtier.format import HEADER_BYTES, Namespace
from kvtier.store.base import FixedClaim
from kvtier.store.shared import KEY_PREFIX, SharedStore
from tests.support.redis_servers import RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import PAYLOAD_BYTES, key_of, payload_of


@pytest.fixture
def open_store(
    redis_standalone: RedisServer, unique_namespace: Callable[[], Namespace]
) -> Iterator[Callable[..., SharedStore]]:
    opened: list[SharedStore] = []

    def open_(namespace: Namespace | None = None) -> SharedStore:
        store = open_shared(redis_standalone.url, namespace or unique_namespace())
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def server_key(store: SharedStore, key: bytes) -> bytes:
    return KEY_PREFIX + store.namespace.digest_hex().encode() + b":" + key.hex().encode()


def flip_payload_byte(value: bytes) -> bytes:
    data = bytearray(value)
    data[HEADER_BYTES + 100] ^= 0x01
    return bytes(data)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (flip_payload_byte, "checksum"),
        (lambda v: v[: HEADER_BYTES + PAYLOAD_BYTES // 2], "length"),
        (lambda v: v[:100], "length"),
        (lambda v: v + b"x", "length"),
        (lambda v: b"\0" * len(v), "bad_magic"),
        (lambda v: v[:60] + bytes([v[60] ^ 0xFF]) + v[61:], "header_checksum"),
    ],
)
@pytest.mark.parametrize("through", ["out", "bounce"])
def test_damaged_value_is_a_miss_deleted_and_counted(
    open_store: Callable[..., SharedStore],
    raw: redis.Redis,
    damage: Callable[[bytes], bytes],
    reason: str,
    through: str,
) -> None:
    store = open_store()
    store.put(key_of(1), payload_of(1))
    sk = server_key(store, key_of(1))
    raw.set(sk, damage(raw.get(sk)))
    out = bytearray(PAYLOAD_BYTES)
    if through == "out":  # get_into: read straight into out
        assert not store.get_into(key_of(1), memoryview(out))
    else:  # the tier's claimed load: read into the bounce buffer, out stays untouched
        bounce = memoryview(bytearray(PAYLOAD_BYTES))
        assert not store.get_into_when(key_of(1), memoryview(out), FixedClaim(), bounce)
        assert out == bytearray(PAYLOAD_BYTES)
    assert raw.exists(sk) == 0
    stats = store.stats()
    assert stats.corrupt == {reason: 1} and stats.corrupt_deleted == 1
    assert not store.contains(key_of(1))


def test_record_of_another_namespace_under_our_key_is_never_served(
    open_store: Callable[..., SharedStore], raw: redis.Redis
) -> None:
    ours, theirs = open_store(), open_store()
    theirs.put(key_of(1), payload_of(666))
    raw.set(server_key(ours, key_of(1)), raw.get(server_key(theirs, key_of(1))))
    assert ours.get(key_of(1)) is None
    assert ours.stats().corrupt == {"namespace": 1}
    assert raw.exists(server_key(ours, key_of(1))) == 0
    assert theirs.get(key_of(1)) == payload_of(666)  # the original is untouched


def test_record_of_another_key_is_never_served(
    open_store: Callable[..., SharedStore], raw: redis.Redis
) -> None:
    store = open_store()
    store.put(key_of(2), payload_of(2))
    raw.set(server_key(store, key_of(1)), raw.get(server_key(store, key_of(2))))
    assert store.get(key_of(1)) is None
    assert store.stats().corrupt == {"key": 1}


def test_wrong_sized_buffer_is_a_miss_that_keeps_the_record(
    open_store: Callable[..., SharedStore], raw: redis.Redis
) -> None:
    writer, reader = open_store(), None
    writer.put(key_of(1), payload_of(1))
    reader = open_store(writer.namespace)  # knows nothing: must fetch to learn the size
    assert not reader.get_into(key_of(1), memoryview(bytearray(PAYLOAD_BYTES - 4096)))
    assert raw.exists(server_key(writer, key_of(1))) == 1
    assert reader.stats().corrupt == {} and reader.payload_len(key_of(1)) == PAYLOAD_BYTES


def test_verify_reports_and_fixes_corrupt_values(
    open_store: Callable[..., SharedStore], raw: redis.Redis
) -> None:
    store = open_store()
    for i in range(3):
        store.put(key_of(i), payload_of(i))
    sk = server_key(store, key_of(1))
    raw.set(sk, flip_payload_byte(raw.get(sk)))
    problems = store.verify()
    assert [(p.kind, p.key, p.fixed) for p in problems] == [("corrupt", key_of(1), False)]
    assert raw.exists(sk) == 1
    assert [p.fixed for p in store.verify(fix=True)] == [True]
    assert raw.exists(sk) == 0 and store.verify() == []
