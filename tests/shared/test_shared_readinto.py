"""GET replies read straight into the caller's buffers (kvtier.store.shared.readinto).

First the reply reader alone, on a scripted socket and a real hiredis reader: the expected
bulk string lands in the buffers; every other reply reaches the parser whole. Then the store on
real servers: nil and error replies, MOVED and ASK during a Cluster slot migration, and replies
cut or stalled part-way by a proxy, after which the next operation on the pool still works.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import hiredis
import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError

from kvtier import native
from kvtier.format import HEADER_BYTES, Namespace
from kvtier.format.record import encode_header, make_header
from kvtier.store.base import FixedClaim
from kvtier.store.shared import KEY_PREFIX, SharedStore
from kvtier.store.shared.client import RecordPool
from kvtier.store.shared.readinto import OPTION, ReadInto, read_reply_into
from tests.support.redis_servers import RedisClusterServers, RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import PAYLOAD_BYTES, key_of, payload_of
from tests.support.tcp_proxy import FaultyProxy

HEAD = 16  # head bytes of the scripted replies (a record header is HEADER_BYTES)
NEXT_REPLY = b"+NEXT\r\n"  # bytes queued after a reply: the reader must never consume them


class ScriptedSocket:
    """``recv_into`` over fixed bytes, at most ``chunk`` bytes a call; EOF at the end."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.chunk, self.pos = data, chunk, 0

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        n = min(len(buffer), nbytes or len(buffer), self.chunk, len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n

    def rest(self) -> bytes:
        return self.data[self.pos :]


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def parse_all(reply: bytes) -> object:
    reader = hiredis.Reader(replyError=ResponseError)
    reader.feed(reply)
    return reader.gets()


@pytest.mark.parametrize("chunk", [1, 3, 7, HEAD + 5, 1 << 20])
def test_the_expected_bulk_string_lands_in_head_and_payload_and_nothing_after_it(
    chunk: int,
) -> None:
    value = bytes(range(HEAD)) + b"p" * 100
    sock = ScriptedSocket(bulk(value) + NEXT_REPLY, chunk)
    payload = memoryview(bytearray(100))
    request = ReadInto(HEAD, payload)
    assert read_reply_into(sock, request, lambda buf, n: pytest.fail("fed the parser"))
    assert bytes(request.head) == value[:HEAD] and bytes(payload) == value[HEAD:]
    assert sock.rest() == NEXT_REPLY


@pytest.mark.parametrize("chunk", [1, 4, 1 << 20])
@pytest.mark.parametrize(
    "reply",
    [
        b"_\r\n",  # RESP3 nil
        b"$-1\r\n",  # RESP2 nil
        b"-MOVED 3999 127.0.0.1:7002\r\n",
        b"-ASK 3999 127.0.0.1:7002\r\n",
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        bulk(b"x" * 115),  # one byte short of the expected value
        bulk(b"x" * 1170),  # a longer value: its length line differs at the first digit
        bulk(b"x" * 12),  # shorter than the head
        b">2\r\n$10\r\ninvalidate\r\n_\r\n" + bulk(b"x" * 116),  # a push frame before it
    ],
)
def test_any_other_reply_reaches_the_parser_whole(reply: bytes, chunk: int) -> None:
    sock = ScriptedSocket(reply, chunk)
    fed = bytearray()
    request = ReadInto(HEAD, memoryview(bytearray(100)))

    def feed(buf: bytearray, n: int) -> None:
        fed.extend(buf[:n])

    assert not read_reply_into(sock, request, feed)
    assert bytes(fed) + sock.rest() == reply  # nothing lost, nothing kept aside


def test_a_reply_cut_short_raises_connection_error() -> None:
    value = bytes(HEAD) + b"p" * 100
    for cut in (2, 10, len(bulk(value)) - 50, len(bulk(value)) - 1):
        sock = ScriptedSocket(bulk(value)[:cut], 1 << 20)
        with pytest.raises(RedisConnectionError, match="closed by server"):
            read_reply_into(sock, ReadInto(HEAD, memoryview(bytearray(100))), lambda b, n: None)


def test_a_bulk_string_without_its_trailer_is_a_protocol_error() -> None:
    reply = bulk(bytes(HEAD) + b"p" * 100)[:-2] + b"XY"
    with pytest.raises(InvalidResponse, match="bulk string ends"):
        read_reply_into(
            ScriptedSocket(reply, 1 << 20), ReadInto(HEAD, memoryview(bytearray(100))), print
        )


# ------------------------------------------------------------------ the store, real servers


def server_key(store: SharedStore, key: bytes) -> bytes:
    return KEY_PREFIX + store.namespace.digest_hex().encode() + b":" + key.hex().encode()


def restore(store: SharedStore, key: bytes, out: bytearray) -> bool:
    """A load as the tier makes it: claimed, through a bounce buffer."""
    bounce = memoryview(bytearray(len(out)))
    return store.get_into_when(key, memoryview(out), FixedClaim(), bounce)


def test_hits_through_out_and_through_the_bounce_buffer_are_read_directly(
    store: SharedStore,
) -> None:
    assert store.put(key_of(1), payload_of(1))
    out = bytearray(PAYLOAD_BYTES)
    assert store.get_into(key_of(1), memoryview(out)) and out == payload_of(1)
    out = bytearray(PAYLOAD_BYTES)
    assert restore(store, key_of(1), out) and out == payload_of(1)
    stats = store.stats()
    assert stats.hits == 2 and stats.direct_hits == 2 and stats.errors == {}


@pytest.mark.parametrize("built", [True, False], ids=["native", "python-loop"])
def test_a_value_is_received_in_one_native_call_where_built_and_alike_without(
    store: SharedStore, monkeypatch: pytest.MonkeyPatch, built: bool
) -> None:
    real = native.socket_receiver()
    if built and real is None:
        pytest.skip("kvtier.native._sockread is not built")
    calls: list[int] = []

    def spy(fd: int, buffers: tuple[memoryview | bytearray, ...], timeout_ms: int):  # type: ignore[no-untyped-def]
        calls.append(len(buffers))
        return real(fd, buffers, timeout_ms)  # type: ignore[misc]

    monkeypatch.setattr(native, "socket_receiver", lambda: spy if built else None)
    assert store.put(key_of(1), payload_of(1))
    out = bytearray(PAYLOAD_BYTES)
    assert store.get_into(key_of(1), memoryview(out)) and out == payload_of(1)
    assert calls == ([2] if built else [])  # the payload and its trailer, in one call
    assert store.stats().direct_hits == 1


def test_without_a_bounce_buffer_the_claimed_load_uses_the_clients_bytes(
    store: SharedStore,
) -> None:
    assert store.put(key_of(1), payload_of(1))
    out = bytearray(PAYLOAD_BYTES)
    assert store.get_into_when(key_of(1), memoryview(out), FixedClaim())
    small = memoryview(bytearray(PAYLOAD_BYTES - 1))
    assert store.get_into_when(key_of(1), memoryview(out), FixedClaim(), small)
    assert out == payload_of(1)
    assert store.stats().hits == 2 and store.stats().direct_hits == 0


def test_a_read_only_out_is_refused_without_opening_the_breaker(store: SharedStore) -> None:
    assert store.put(key_of(1), payload_of(1))
    with pytest.raises(TypeError):
        store.get_into(key_of(1), memoryview(bytes(PAYLOAD_BYTES)))
    assert store.stats().breaker_openings == 0 and store.stats().errors == {}
    assert store.get(key_of(1)) == payload_of(1)


def test_a_refused_claim_leaves_out_untouched(store: SharedStore) -> None:
    assert store.put(key_of(1), payload_of(1))
    out = bytearray(PAYLOAD_BYTES)
    bounce = memoryview(bytearray(PAYLOAD_BYTES))
    assert not store.get_into_when(key_of(1), memoryview(out), FixedClaim(grant=False), bounce)
    assert out == bytearray(PAYLOAD_BYTES) and bytes(bounce) == payload_of(1)


def test_nil_reply_is_a_miss_and_the_connection_serves_the_next_get(
    store: SharedStore, raw: redis.Redis
) -> None:
    assert store.put(key_of(1), payload_of(1)) and store.put(key_of(2), payload_of(2))
    raw.delete(server_key(store, key_of(1)))  # gone behind the store's back
    out = bytearray(PAYLOAD_BYTES)
    assert not restore(store, key_of(1), out)
    assert not store.contains(key_of(1)) and store.stats().misses == 1
    assert restore(store, key_of(2), out) and out == payload_of(2)


def test_error_reply_is_a_miss_counted_as_response_and_keeps_the_breaker_closed(
    store: SharedStore, raw: redis.Redis
) -> None:
    assert store.put(key_of(1), payload_of(1)) and store.put(key_of(2), payload_of(2))
    sk = server_key(store, key_of(1))
    raw.delete(sk)
    raw.rpush(sk, b"not a string")  # GET answers -WRONGTYPE
    out = bytearray(PAYLOAD_BYTES)
    assert not restore(store, key_of(1), out)
    stats = store.stats()
    assert stats.errors == {"response": 1} and stats.breaker_openings == 0
    assert restore(store, key_of(2), out) and out == payload_of(2)


def test_header_claiming_another_length_in_a_value_of_the_expected_length_is_deleted(
    store: SharedStore, raw: redis.Redis
) -> None:
    short = payload_of(1, PAYLOAD_BYTES - 8)
    header = encode_header(make_header(store.namespace.digest(), key_of(1), short))
    sk = server_key(store, key_of(1))
    raw.set(sk, bytes(header) + short + bytes(8))  # HEADER_BYTES + PAYLOAD_BYTES in all
    assert raw.strlen(sk) == HEADER_BYTES + PAYLOAD_BYTES
    assert not restore(store, key_of(1), bytearray(PAYLOAD_BYTES))
    assert store.stats().corrupt == {"length": 1} and raw.exists(sk) == 0


def test_a_health_check_ping_sent_before_the_get_is_read_by_the_parser(
    redis_standalone: RedisServer, raw: redis.Redis
) -> None:
    raw.set(b"readinto:ping", b"h" * 10 + b"p" * 1000)
    pings = raw.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)
    pool = RecordPool(port=redis_standalone.port, health_check_interval=1e-9)  # PING each time
    client = redis.Redis(connection_pool=pool)
    try:
        for _ in range(3):
            request = ReadInto(10, memoryview(bytearray(1000)))
            assert client.execute_command("GET", b"readinto:ping", **{OPTION: request}) is request
            assert bytes(request.head) == b"h" * 10 and bytes(request.payload) == b"p" * 1000
    finally:
        client.close()
    assert raw.info("commandstats")["cmdstat_ping"]["calls"] >= pings + 2


# ------------------------------------------------------------------ cut and stalled replies

OP_TIMEOUT_S = 0.5


@pytest.fixture
def proxied(
    fresh_server: Callable[..., RedisServer], unique_namespace: Callable[[], Namespace]
) -> Iterator[Callable[..., tuple[SharedStore, FaultyProxy]]]:
    server = fresh_server()
    opened: list[tuple[SharedStore, FaultyProxy]] = []

    def open_(retries: int) -> tuple[SharedStore, FaultyProxy]:
        proxy = FaultyProxy(server.port)
        store = open_shared(
            proxy.url, unique_namespace(), op_timeout_s=OP_TIMEOUT_S, connect_timeout_s=0.3,
            retries=retries, breaker_base_s=0.2, breaker_max_s=0.2,
        )  # fmt: skip
        opened.append((store, proxy))
        return store, proxy

    yield open_
    for store, proxy in opened:
        store.close()
        proxy.close()


# Where the reply breaks: in the length line, in the record header, in the payload.
CUTS = [3, HEADER_BYTES // 2, HEADER_BYTES + PAYLOAD_BYTES // 2]


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.client_side
def test_reply_cut_part_way_is_a_connection_miss_and_the_pool_serves_the_next_get(
    proxied: Callable[..., tuple[SharedStore, FaultyProxy]], cut: int
) -> None:
    store, proxy = proxied(retries=0)
    assert store.put(key_of(1), payload_of(1))
    out = bytearray(PAYLOAD_BYTES)
    proxy.cut_after(cut)
    assert not restore(store, key_of(1), out)
    assert proxy.struck == 1 and out == bytearray(PAYLOAD_BYTES)
    assert store.stats().errors == {"connection": 1}
    time.sleep(0.3)  # the breaker's back-off
    for _ in range(3):
        assert restore(store, key_of(1), out) and out == payload_of(1)
    assert store.stats().corrupt == {} and store.stats().direct_hits == 3


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.client_side
def test_reply_stalled_part_way_times_out_within_the_op_timeout_and_recovers(
    proxied: Callable[..., tuple[SharedStore, FaultyProxy]], cut: int
) -> None:
    store, proxy = proxied(retries=0)
    assert store.put(key_of(1), payload_of(1))
    out = bytearray(PAYLOAD_BYTES)
    proxy.stall_after(cut)
    start = time.monotonic()
    assert not restore(store, key_of(1), out)
    assert OP_TIMEOUT_S * 0.9 <= time.monotonic() - start < OP_TIMEOUT_S + 1.5
    assert out == bytearray(PAYLOAD_BYTES)
    assert store.stats().errors == {"timeout": 1} and store.stats().breaker_openings == 1
    time.sleep(0.3)
    for _ in range(3):
        assert restore(store, key_of(1), out) and out == payload_of(1)
    assert store.stats().corrupt == {}


@pytest.mark.client_side
def test_with_a_retry_a_cut_reply_is_read_again_on_a_new_connection(
    proxied: Callable[..., tuple[SharedStore, FaultyProxy]],
) -> None:
    store, proxy = proxied(retries=1)
    assert store.put(key_of(1), payload_of(1))
    out = bytearray(PAYLOAD_BYTES)
    proxy.cut_after(HEADER_BYTES + 100)
    assert restore(store, key_of(1), out) and out == payload_of(1)
    assert proxy.struck == 1 and store.stats().direct_hits == 1


# ------------------------------------------------------------------ Cluster: MOVED and ASK


def _redirects(node: redis.Redis) -> dict[str, int]:
    stats = node.info("errorstats")
    return {k: v["count"] for k, v in stats.items() if k in ("errorstat_ASK", "errorstat_MOVED")}


def test_slot_migration_redirects_with_ask_then_moved_and_reads_directly_on_the_new_node(
    fresh_cluster: RedisClusterServers, unique_namespace: Callable[[], Namespace]
) -> None:
    store = open_shared(fresh_cluster.url, unique_namespace())
    nodes = {n.port: redis.Redis(port=n.port) for n in fresh_cluster.nodes}
    try:
        assert store.put(key_of(1), payload_of(1))
        sk = server_key(store, key_of(1))
        probe = next(iter(nodes.values()))
        slot = probe.cluster("keyslot", sk)
        # COUNTKEYSINSLOT counts a node's own keys (EXISTS on another node answers MOVED).
        owner = next(p for p, c in nodes.items() if c.cluster("countkeysinslot", slot))
        target = next(p for p in nodes if p != owner)
        src, dst = nodes[owner], nodes[target]
        src_id, dst_id = src.cluster("myid"), dst.cluster("myid")
        dst.cluster("setslot", slot, "importing", src_id)
        src.cluster("setslot", slot, "migrating", dst_id)
        src.migrate("127.0.0.1", target, sk, 0, 5000)
        out = bytearray(PAYLOAD_BYTES)
        assert restore(store, key_of(1), out) and out == payload_of(1)  # -ASK from the source
        assert _redirects(src) == {"errorstat_ASK": 1}
        for client in nodes.values():
            client.cluster("setslot", slot, "node", dst_id)
        out = bytearray(PAYLOAD_BYTES)
        assert restore(store, key_of(1), out) and out == payload_of(1)  # -MOVED from it
        assert _redirects(src) == {"errorstat_ASK": 1, "errorstat_MOVED": 1}
        assert restore(store, key_of(1), out)  # the slot map now points at the new owner
        assert _redirects(src) == {"errorstat_ASK": 1, "errorstat_MOVED": 1}
        stats = store.stats()
        assert stats.hits == stats.direct_hits == 3 and stats.errors == {}
    finally:
        store.close()
        for client in nodes.values():
            client.close()
