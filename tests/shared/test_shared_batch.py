"""A thread's share of a load's GETs in one native exchange (kvtier.store.shared.batch).

First the native exchange alone, on a socket pair whose far end answers scripted replies: the
expected values land in their rows under their claims, nils are read whole, and at any other
reply nothing is lost: the bytes read of it plus what is still on the socket are exactly the
replies from there on. Then the store on real servers, standalone and Cluster: what lands
equals what was stored, and nils, error replies, values of another length, corrupt values,
abandoned loads, cut and stalled replies and a dead server each end as ``get_into_when``
would have ended, the other keys of the share still served.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from kvtier import native
from kvtier.dataplane.abandonable import AbandonableLoad, LoadState
from kvtier.format import HEADER_BYTES, Namespace
from kvtier.format.record import encode_header, make_header
from kvtier.store.base import FixedClaim
from kvtier.store.shared import KEY_PREFIX, SharedStore, batch
from tests.shared.test_shared_sealed import sealer_of
from tests.support.redis_servers import RedisClusterServers, RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import PAYLOAD_BYTES, key_of, payload_of
from tests.support.tcp_proxy import FaultyProxy
from tests.support.waiting import wait_until

exchanger = native.socket_exchanger()
said = native.socket_statuses()
needs_native = pytest.mark.skipif(exchanger is None, reason="kvtier.native._sockread not built")

HEAD = 16  # header bytes of the scripted values (a record's is HEADER_BYTES)
ROW = 1000  # payload bytes of the scripted values


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def scripted_value(i: int) -> bytes:
    return bytes([i]) * HEAD + bytes([i + 100]) * ROW


class Scripted:
    """The exchange's arguments for ``n`` GETs of ``HEAD + ROW`` bytes, and a socket pair
    whose far end sends ``replies`` once it has read the first ``answer_after`` requests
    (default: the window's), then, with ``hang_up``, closes its sending side."""

    def __init__(
        self,
        n: int,
        replies: bytes,
        window: int = 64,
        answer_after: int | None = None,
        hang_up: bool = False,
    ) -> None:
        self.near, self.far = socket.socketpair()
        self.near.settimeout(2.0)
        self.requests = [b"GET k%d\r\n" % i for i in range(n)]
        self.rows = [memoryview(bytearray(ROW)) for _ in range(n)]
        self.loads = [AbandonableLoad() for _ in range(n)]
        self.headers = memoryview(bytearray(HEAD * n))
        self.window = window
        self.answer_after = window if answer_after is None else answer_after
        self.replies = replies
        self.hang_up = hang_up
        #: Called by the far end once it has read the requests, before it answers.
        self.before_reply: Callable[[], object] | None = None
        self._answer = threading.Thread(target=self._serve, daemon=True)
        self._answer.start()

    def _serve(self) -> None:
        wanted = sum(len(r) for r in self.requests[: self.answer_after])
        got = b""
        while len(got) < wanted:
            chunk = self.far.recv(65536)
            if not chunk:
                return
            got += chunk
        time.sleep(0.1)  # time for requests beyond the window to arrive, were any sent
        self.far.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            got += self.far.recv(65536)
        self.far.setblocking(True)
        #: Requests read before any reply was sent, beyond the first ``answer_after``.
        self.early = got[wanted:]
        #: Every request read before any reply was sent.
        self.received = got
        if self.before_reply is not None:
            self.before_reply()
        self.far.sendall(self.replies)
        if self.hang_up:
            self.far.shutdown(socket.SHUT_WR)

    def run(
        self, lock: object | None = None
    ) -> tuple[int, int, int, int, bytes, list[tuple[int, int | None]]]:
        assert exchanger is not None
        lines = [b"$%d\r\n" % (HEAD + ROW)] * len(self.requests)
        bounce = memoryview(bytearray(ROW))
        return exchanger(
            self.near.fileno(), self.requests, lines, self.headers, bounce, self.rows,
            [load.native_cell for load in self.loads], self.window, False, 2000, lock,
        )  # fmt: skip

    def rest(self) -> bytes:
        """What is still on the near socket, once the far end closed."""
        self._answer.join()
        self.far.close()
        data = b""
        while chunk := self.near.recv(65536):
            data += chunk
        return data

    def close(self) -> None:
        self.near.close()
        self.far.close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def make(n: int, replies: bytes, **options: Any) -> Scripted:
        made.append(Scripted(n, replies, **options))
        return made[-1]

    yield make
    for pair in made:
        pair.close()


@needs_native
@pytest.mark.parametrize("nil", [b"_\r\n", b"$-1\r\n"], ids=["resp3-nil", "resp2-nil"])
def test_values_land_in_their_rows_and_nils_are_read_whole(
    scripted: Callable[..., Scripted], nil: bytes
) -> None:
    pair = scripted(4, bulk(scripted_value(0)) + nil + bulk(scripted_value(2)) + nil)
    status, decided, settled, _, _, answers = pair.run()
    assert said is not None and (status, decided, settled) == (said.done, 4, 4)
    assert [landed for landed, _ in answers] == [
        said.get_copied, said.get_nil, said.get_copied, said.get_nil,
    ]  # fmt: skip
    for i in (0, 2):
        assert bytes(pair.headers[i * HEAD : (i + 1) * HEAD]) == scripted_value(i)[:HEAD]
        assert bytes(pair.rows[i]) == scripted_value(i)[HEAD:]
        assert pair.loads[i].state is LoadState.WRITTEN
    assert bytes(pair.rows[1]) == bytes(ROW) and pair.loads[1].state is LoadState.PENDING
    assert pair.rest() == b""


@needs_native
@pytest.mark.parametrize(
    "odd",
    [
        b"-MOVED 3999 127.0.0.1:7002\r\n",
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        bulk(b"x" * 12),  # shorter than the expected line
        bulk(b"x" * (HEAD + ROW + 1)),  # one byte longer
        b"$-2\r\n",  # no nil, though it starts like one
    ],
)
def test_at_another_reply_nothing_is_lost_and_nothing_after_it_is_kept(
    scripted: Callable[..., Scripted], odd: bytes
) -> None:
    later = odd + bulk(scripted_value(2)) + b"_\r\n"
    pair = scripted(4, bulk(scripted_value(0)) + later)
    status, decided, settled, _, unparsed, answers = pair.run()
    assert said is not None and (status, decided, settled) == (said.other_reply, 4, 1)
    assert [landed for landed, _ in answers] == [said.get_copied] + [said.get_awaiting] * 3
    assert unparsed + pair.rest() == later
    assert bytes(pair.rows[2]) == bytes(ROW) and pair.loads[2].state is LoadState.PENDING


@needs_native
def test_a_load_abandoned_before_its_turn_is_not_asked_for(
    scripted: Callable[..., Scripted],
) -> None:
    pair = scripted(3, bulk(scripted_value(0)) + bulk(scripted_value(2)), answer_after=2)
    assert pair.loads[1].abandon()
    status, decided, settled, _, _, answers = pair.run()
    assert said is not None and (status, decided, settled) == (said.done, 3, 3)
    assert [landed for landed, _ in answers] == [
        said.get_copied, said.get_not_sent, said.get_copied,
    ]  # fmt: skip
    assert pair.received == pair.requests[0] + pair.requests[2]
    assert bytes(pair.rows[1]) == bytes(ROW) and bytes(pair.rows[2]) == scripted_value(2)[HEAD:]


@needs_native
def test_a_load_abandoned_while_its_value_arrives_is_never_copied(
    scripted: Callable[..., Scripted],
) -> None:
    pair = scripted(2, bulk(scripted_value(0)) + bulk(scripted_value(1)))
    # Pending when its GET went out, abandoned (its deadline) before the value is claimed.
    pair.before_reply = lambda: pair.loads[0].abandon()
    status, _, settled, _, _, answers = pair.run()
    assert said is not None and (status, settled) == (said.done, 2)
    assert pair.received == b"".join(pair.requests)
    assert [landed for landed, _ in answers] == [said.get_not_claimed, said.get_copied]
    assert bytes(pair.rows[0]) == bytes(ROW) and bytes(pair.rows[1]) == scripted_value(1)[HEAD:]


@needs_native
def test_a_window_of_one_sends_each_get_after_the_previous_reply(
    scripted: Callable[..., Scripted],
) -> None:
    pair = scripted(3, b"".join(bulk(scripted_value(i)) for i in range(3)), window=1)
    status, decided, settled, _, _, _ = pair.run()
    assert said is not None and (status, decided, settled) == (said.done, 3, 3)
    assert pair.early == b""  # the second GET went out only once the first was answered
    # With a window of three all go out at once (the far end still answers after the first).
    wide = scripted(3, b"".join(bulk(scripted_value(i)) for i in range(3)), answer_after=1)
    wide.window = 3
    wide.run()
    assert wide.early == b"".join(wide.requests[1:])


@needs_native
@pytest.mark.parametrize(
    ("replies", "status_name"),
    [
        (bulk(scripted_value(0))[:-2] + b"XY", "bad_trailer"),
        (bulk(scripted_value(0))[: HEAD + 40], "peer_closed"),
        (b"$10", "peer_closed"),
    ],
)
def test_a_bad_trailer_or_a_reply_cut_short_stops_the_exchange(
    scripted: Callable[..., Scripted], replies: bytes, status_name: str
) -> None:
    pair = scripted(2, replies, hang_up=True)
    status, _, settled, _, _, _ = pair.run()
    assert said is not None and status == getattr(said, status_name) and settled == 0
    assert pair.loads[0].state is LoadState.PENDING and bytes(pair.rows[0]) == bytes(ROW)


@needs_native
@pytest.mark.parametrize("shared_lock", [True, False])
def test_exchanges_given_one_lock_run_one_at_a_time(
    scripted: Callable[..., Scripted], shared_lock: bool
) -> None:
    """The second exchange sends nothing while the first, holding the lock, waits for its
    server; without a common lock (the control) it goes ahead."""
    release = threading.Event()
    first = scripted(1, bulk(scripted_value(0)))
    first.before_reply = lambda: release.wait(10)
    second = scripted(1, bulk(scripted_value(1)))
    lock = native.exchange_lock()
    results: dict[str, Any] = {}
    threads = [
        threading.Thread(target=lambda: results.update(first=first.run(lock))),
        threading.Thread(
            target=lambda: results.update(second=second.run(lock if shared_lock else None))
        ),
    ]
    threads[0].start()
    assert wait_until(lambda: hasattr(first, "received"), 10, 0.01), "no first GET"
    threads[1].start()
    went_ahead = wait_until(lambda: hasattr(second, "received"), 0.5, 0.01)
    release.set()
    for thread in threads:
        thread.join(10)
    assert went_ahead is not shared_lock
    assert said is not None
    assert results["first"][0] == said.done and results["second"][0] == said.done
    assert bytes(second.rows[0]) == scripted_value(1)[HEAD:]


# ------------------------------------------------------------------ the store, real servers


def server_key(store: SharedStore, key: bytes) -> bytes:
    return KEY_PREFIX + store.namespace.digest_hex().encode() + b":" + key.hex().encode()


class Share:
    """A thread's share of a load: rows of one buffer, a load per key, a bounce buffer."""

    def __init__(self, n: int, payload_bytes: int = PAYLOAD_BYTES) -> None:
        self.keys = [key_of(i) for i in range(n)]
        self.rows = [memoryview(bytearray(payload_bytes)) for _ in range(n)]
        self.loads = [AbandonableLoad() for _ in range(n)]
        self.bounce = memoryview(bytearray(payload_bytes))

    def load(self, store: SharedStore) -> list[bool]:
        return store.get_many_into_when(self.keys, self.rows, self.loads, self.bounce)

    def served(self, i: int) -> bool:
        return bytes(self.rows[i]) == payload_of(i)

    def untouched(self, i: int) -> bool:
        return bytes(self.rows[i]) == bytes(self.rows[i].nbytes)


def filled(store: SharedStore, n: int) -> SharedStore:
    for i in range(n):
        assert store.put(key_of(i), payload_of(i))
    return store


@pytest.fixture
def exchanges(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of GETs of each exchange made from now on."""
    calls: list[int] = []
    real = batch.exchange

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "exchange", counting)
    return calls


@needs_native
def test_a_share_lands_in_one_exchange_equal_to_what_was_stored(
    store: SharedStore, exchanges: list[int]
) -> None:
    calls = exchanges
    share = Share(12)
    assert share.load(filled(store, 12)) == [True] * 12
    assert all(share.served(i) for i in range(12)) and calls == [12]
    assert all(load.state is LoadState.WRITTEN for load in share.loads)
    stats = store.stats()
    assert stats.hits == stats.batched_hits == 12 and stats.misses == 0 and stats.errors == {}


@needs_native
def test_shares_exchanged_one_at_a_time_land_equal_to_what_was_stored(
    store: SharedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four threads' shares with the server taken one at a time (``batch.ONE_AT_A_TIME``)."""
    monkeypatch.setattr(batch, "ONE_AT_A_TIME", True)
    filled(store, 16)
    shares = [Share(16) for _ in range(4)]
    picks = [list(range(t, 16, 4)) for t in range(4)]
    loaded: dict[int, list[bool]] = {}

    def read(t: int) -> None:
        share, keys = shares[t], picks[t]
        loaded[t] = store.get_many_into_when(
            [share.keys[i] for i in keys], [share.rows[i] for i in keys],
            [share.loads[i] for i in keys], share.bounce,
        )  # fmt: skip

    threads = [threading.Thread(target=read, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert loaded == {t: [True] * 4 for t in range(4)}
    assert all(shares[t].served(i) for t in range(4) for i in picks[t])
    assert store.stats().batched_hits == 16


@needs_native
def test_on_a_cluster_each_master_gets_one_exchange_for_its_keys(
    redis_cluster: RedisClusterServers,
    unique_namespace: Callable[[], Namespace],
    exchanges: list[int],
) -> None:
    calls = exchanges
    with open_shared(redis_cluster.url, unique_namespace()) as store:
        share = Share(24)
        assert share.load(filled(store, 24)) == [True] * 24
        assert all(share.served(i) for i in range(24))
        assert store.stats().batched_hits == 24
    assert sum(calls) == 24 and len(calls) == len(redis_cluster.nodes)  # keys spread over all


@needs_native
def test_small_windows_and_shares_split_into_exchanges_serve_the_same(
    store: SharedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch, "WINDOW_BYTES", 1)  # one value in flight
    monkeypatch.setattr(batch, "MAX_GETS", 3)
    share = Share(10)
    assert share.load(filled(store, 10)) == [True] * 10
    assert all(share.served(i) for i in range(10)) and store.stats().batched_hits == 10


@needs_native
def test_evicted_keys_are_misses_inside_the_exchange_and_forgotten(
    store: SharedStore, raw: redis.Redis
) -> None:
    filled(store, 6)
    for i in (1, 4):
        raw.delete(server_key(store, key_of(i)))  # evicted behind the store's back
    share = Share(6)
    assert share.load(store) == [True, False, True, True, False, True]
    assert share.untouched(1) and share.untouched(4)
    assert not store.contains(key_of(1)) and not store.contains(key_of(4))
    stats = store.stats()
    assert stats.batched_hits == 4 and stats.misses == 2 and stats.errors == {}


@needs_native
def test_an_error_reply_is_a_miss_and_the_keys_after_it_are_still_served(
    store: SharedStore, raw: redis.Redis
) -> None:
    filled(store, 6)
    sk = server_key(store, key_of(2))
    raw.delete(sk)
    raw.rpush(sk, b"not a string")  # GET answers -WRONGTYPE
    share = Share(6)
    assert share.load(store) == [True, True, False, True, True, True]
    assert all(share.served(i) for i in (0, 1, 3, 4, 5)) and share.untouched(2)
    stats = store.stats()
    assert stats.errors == {"response": 1} and stats.breaker_openings == 0
    assert stats.hits == 5 and stats.batched_hits == 2  # after the odd reply: a GET each


@needs_native
def test_a_value_of_another_length_is_a_miss_and_the_record_stays(
    redis_standalone: RedisServer, unique_namespace: Callable[[], Namespace]
) -> None:
    namespace = unique_namespace()
    with open_shared(redis_standalone.url, namespace) as writer:
        filled(writer, 4)
        assert writer.put(key_of(1), payload_of(1, PAYLOAD_BYTES // 2))
    with open_shared(redis_standalone.url, namespace) as reader:  # a view that knows nothing
        share = Share(4)
        assert share.load(reader) == [True, False, True, True]
        assert share.untouched(1) and reader.payload_len(key_of(1)) == PAYLOAD_BYTES // 2
        assert reader.stats().corrupt == {}


@needs_native
@pytest.mark.parametrize("damage", ["payload", "header-length"])
def test_a_corrupt_value_fails_its_load_is_deleted_and_the_rest_are_served(
    store: SharedStore, raw: redis.Redis, damage: str
) -> None:
    filled(store, 4)
    sk = server_key(store, key_of(2))
    if damage == "payload":
        raw.setrange(sk, HEADER_BYTES + 100, b"\xff\x00\xff")
    else:  # a header for a shorter payload, in a value of the expected length
        short = payload_of(2, PAYLOAD_BYTES - 8)
        header = encode_header(make_header(store.namespace.digest(), key_of(2), short))
        raw.set(sk, bytes(header) + short + bytes(8))
    share = Share(4)
    assert share.load(store) == [True, True, False, True]
    assert raw.exists(sk) == 0 and store.stats().corrupt_deleted == 1
    assert store.stats().corrupt == {"checksum" if damage == "payload" else "length": 1}


def _gets_served(raw: redis.Redis) -> int:
    return int(raw.info("commandstats").get("cmdstat_get", {}).get("calls", 0))


@needs_native
def test_loads_abandoned_before_the_exchange_are_not_asked_for_written_or_counted(
    store: SharedStore, raw: redis.Redis
) -> None:
    share = Share(5)
    filled(store, 5)
    for i in (0, 3):
        assert share.loads[i].abandon()
    before = _gets_served(raw)
    assert share.load(store) == [False, True, True, False, True]
    assert _gets_served(raw) - before == 3  # the server served this store's three GETs
    assert share.untouched(0) and share.untouched(3)
    assert store.stats().hits == 3 and store.stats().misses == 0


@needs_native
def test_a_load_abandoned_after_its_copy_is_not_reported_loaded(
    store: SharedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    share = Share(3)
    filled(store, 3)
    real = batch.exchange

    def then_abandon(*args, **kwargs):  # type: ignore[no-untyped-def]
        done = real(*args, **kwargs)
        assert share.loads[1].abandon()  # WRITTEN -> ABANDONED: the scheduler's deadline
        return done

    monkeypatch.setattr(batch, "exchange", then_abandon)
    assert share.load(store) == [True, False, True]
    assert store.stats().corrupt == {}


@pytest.mark.parametrize("why", ["sealed", "not-built", "plain-claims"])
def test_where_no_exchange_can_run_each_key_gets_its_own_get(
    redis_standalone: RedisServer,
    unique_namespace: Callable[[], Namespace],
    monkeypatch: pytest.MonkeyPatch,
    why: str,
) -> None:
    sealer = sealer_of() if why == "sealed" else None
    if why == "not-built":
        monkeypatch.setattr(native, "socket_exchanger", lambda: None)
    with open_shared(redis_standalone.url, unique_namespace(), sealer=sealer) as store:
        share = Share(4)
        filled(store, 4)
        claims = [FixedClaim()] * 4 if why == "plain-claims" else share.loads
        assert store.get_many_into_when(share.keys, share.rows, claims, share.bounce) == [True] * 4
        assert all(share.served(i) for i in range(4))
        assert store.stats().hits == 4 and store.stats().batched_hits == 0


# ------------------------------------------------------------------ faults

OP_TIMEOUT_S = 0.5


@pytest.fixture
def proxied(
    fresh_server: Callable[..., RedisServer], unique_namespace: Callable[[], Namespace]
) -> Iterator[tuple[SharedStore, FaultyProxy]]:
    proxy = FaultyProxy(fresh_server().port)
    store = open_shared(
        proxy.url, unique_namespace(), op_timeout_s=OP_TIMEOUT_S, connect_timeout_s=0.3,
        retries=0, breaker_base_s=0.2, breaker_max_s=0.2,
    )  # fmt: skip
    yield store, proxy
    store.close()
    proxy.close()


# Where the replies break: in the first value's payload, in the third value's header.
REPLY = HEADER_BYTES + PAYLOAD_BYTES + 9  # "$12288\r\n" + value + "\r\n"
CUTS = [HEADER_BYTES + 100, 2 * REPLY + 20]


@needs_native
@pytest.mark.client_side
@pytest.mark.parametrize("cut", CUTS)
def test_a_reply_cut_part_way_keeps_what_landed_misses_the_rest_and_the_pool_recovers(
    proxied: tuple[SharedStore, FaultyProxy], cut: int
) -> None:
    store, proxy = proxied
    filled(store, 4)
    share = Share(4)
    proxy.cut_after(cut)
    landed = cut // REPLY
    assert share.load(store) == [i < landed for i in range(4)]
    assert all(share.served(i) for i in range(landed))
    assert all(share.untouched(i) for i in range(landed, 4))
    assert proxy.struck == 1 and store.stats().errors == {"connection": 1}
    time.sleep(0.3)  # the breaker's back-off
    again = Share(4)
    assert again.load(store) == [True] * 4 and all(again.served(i) for i in range(4))
    assert store.stats().corrupt == {}


@needs_native
@pytest.mark.client_side
def test_a_reply_stalled_part_way_costs_one_op_timeout_and_recovers(
    proxied: tuple[SharedStore, FaultyProxy],
) -> None:
    store, proxy = proxied
    filled(store, 4)
    share = Share(4)
    proxy.stall_after(REPLY + 50)
    start = time.monotonic()
    assert share.load(store) == [True, False, False, False]
    assert OP_TIMEOUT_S * 0.9 <= time.monotonic() - start < OP_TIMEOUT_S + 1.5
    assert store.stats().errors == {"timeout": 1} and store.stats().breaker_openings == 1
    time.sleep(0.3)
    again = Share(4)
    assert again.load(store) == [True] * 4 and all(again.served(i) for i in range(4))


@needs_native
@pytest.mark.client_side
def test_a_dead_server_is_a_miss_for_every_key_without_raising(
    fresh_server: Callable[..., RedisServer], unique_namespace: Callable[[], Namespace]
) -> None:
    server = fresh_server()
    store = open_shared(
        server.url, unique_namespace(), op_timeout_s=OP_TIMEOUT_S, connect_timeout_s=0.3,
        retries=0, breaker_base_s=5, breaker_max_s=5,
    )  # fmt: skip
    try:
        filled(store, 6)
        server.kill()
        share = Share(6)
        assert share.load(store) == [False] * 6
        assert all(share.untouched(i) for i in range(6))
        stats = store.stats()
        assert stats.errors == {"connection": 1} and stats.breaker_openings == 1
        assert share.load(store) == [False] * 6  # the breaker is open: no I/O at all
        assert store.stats().breaker_skips == 6
    finally:
        store.close()


@needs_native
def test_a_share_that_cannot_be_exchanged_does_not_keep_the_breakers_probe(
    redis_standalone: RedisServer,
    unique_namespace: Callable[[], Namespace],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with open_shared(redis_standalone.url, unique_namespace(), breaker_base_s=0.05) as store:
        filled(store, 3)
        store._breaker(store._node_of(server_key(store, key_of(0)))).failure()  # opened
        time.sleep(0.1)  # its back-off ends: the next operation is its probe
        monkeypatch.setattr(batch, "exchange", lambda *args, **kwargs: None)
        share = Share(3)
        assert share.load(store) == [True] * 3  # a GET each, the first of them the probe
        assert all(share.served(i) for i in range(3)) and store.stats().breaker_skips == 0


@needs_native
def test_an_error_inside_the_exchange_is_a_miss_for_its_keys_never_raised(
    store: SharedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    filled(store, 3)

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("a bug in the exchange")

    monkeypatch.setattr(batch, "exchange", broken)
    share = Share(3)
    assert share.load(store) == [False] * 3
    assert store.stats().errors == {"unexpected": 1} and store.stats().misses == 3


@needs_native
@pytest.mark.client_side
def test_with_a_retry_a_cut_exchange_is_sent_again_on_a_new_connection(
    fresh_server: Callable[..., RedisServer], unique_namespace: Callable[[], Namespace]
) -> None:
    proxy = FaultyProxy(fresh_server().port)
    store = open_shared(
        proxy.url, unique_namespace(), op_timeout_s=OP_TIMEOUT_S, connect_timeout_s=0.3,
        retries=1,
    )  # fmt: skip
    try:
        filled(store, 4)
        share = Share(4)
        proxy.cut_after(REPLY + 100)
        assert share.load(store) == [True] * 4 and all(share.served(i) for i in range(4))
        stats = store.stats()
        assert proxy.struck == 1 and stats.batched_hits == 4 and stats.errors == {}
    finally:
        store.close()
        proxy.close()
