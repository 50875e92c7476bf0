"""A thread's share of a load's GETs in one GIL-free native call, over one pooled connection.

Why: an engine's loop runs Python without pause while a request waits for its restore, and
each time an I/O thread gives the GIL up it may wait out the interpreter's switch interval to
get it back. A GET per record gives it up about four times (the send, the reply's first line,
the value, the check and copy), and beside a busy Python thread those waits take several times
the read itself (docs/shared-tier.md, "Beside a busy Python thread"). ``exchange`` sends a
share's GETs and receives,
hashes, claims and copies every value in one call (``kvtier.native.socket_exchanger``): one
hand-over per share. A GET whose load was abandoned (its deadline passed) before its turn to be
sent is not sent: after a deadline the thread is not held up by values nobody will use.

What is read raw is what ``readinto`` reads raw, a bulk string of exactly the expected length
(see there why any other reply differs within its first line), and a nil (a key the server
evicted). The call stops at the first reply of another form (an error such as MOVED, a value
of another length); the bytes it read of it go to the connection's hiredis reader, and
redis-py's parser reads that reply and every later one already asked for
(``Exchanged.replies``). GETs not sent by then are left to the caller.

At most ``WINDOW_BYTES`` of values are asked for and not yet received (at least one value). A
reply the socket cannot take at once waits in the server's output buffer: a copy on the
server's one thread, memory it weighs against ``maxmemory`` (a deep pipeline of large values
would make it evict keys). Four readers (the tier's default) gain nothing from a deeper
window (docs/shared-tier.md, "Beside a busy Python thread"): so the window is about what a
loopback socket buffers, and small values still share a round trip.

A value lands in its row only once its load is claimed (``kvtier.dataplane.abandonable``): it
is received into the thread's bounce buffer, then claimed and copied, and the claim moved on to
WRITTEN, all inside the call. Its header and payload checksum come back for the caller to
verify; a record that fails leaves its row written and its load failed (vLLM frees a failed
load's row unread).

A socket fault (EOF, timeout, error, a bad trailer) disconnects the connection, which may hold
half a reply, and comes back as redis-py's exception for it (``Exchanged.fault``); the values
received before it stay good.
"""

from __future__ import annotations

import os
import socket
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis.connection import Connection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvtier import native
from kvtier.format.record import HEADER_BYTES
from kvtier.store.shared import readinto
from kvtier.store.shared.client import hiredis

#: Bytes of values asked for and not yet received, per exchange (see the module docstring).
WINDOW_BYTES = 4 << 20
#: Most GETs one exchange takes (bounds the headers buffer and one call's lists).
MAX_GETS = 64

#: Whether a server's exchanges run one at a time (a lock per connection pool, taken inside
#: the native call, without the GIL). Off: it helps four readers on a host of two cores and
#: gains nothing on one of many, where kvtier serves (``python -m benchmarks shared-busy``,
#: path ``exchange, native lock``; docs/shared-tier.md, "Beside a busy Python thread").
ONE_AT_A_TIME = False
#: Per pool, the process that made its lock and the lock: a forked child makes its own (a copy
#: of a lock held at the fork would never be given back). Two threads asking at once may each
#: make one, which only lets two exchanges overlap once.
_locks: weakref.WeakKeyDictionary[ConnectionPool, tuple[int, object]] = weakref.WeakKeyDictionary()


def _lock_of(pool: ConnectionPool) -> object | None:
    """The lock of ``pool``'s exchanges in this process (None where the module is not built)."""
    made = _locks.get(pool)
    if made is not None and made[0] == os.getpid():
        return made[1]
    lock = native.exchange_lock()
    if lock is not None:
        _locks[pool] = (os.getpid(), lock)
    return lock


class _NotSent:
    def __repr__(self) -> str:
        return "NOT_SENT"


#: In ``Exchanged.replies``: a GET not sent, its load no longer pending when its turn came.
NOT_SENT = _NotSent()


@dataclass(frozen=True, slots=True)
class Landed:
    """A GET done with: ``found`` False for a nil (no such key); else the value, ``copied``
    into its row (False: its load was no longer pending, the row untouched, the value maybe
    not even asked for), its header, and its payload's XXH3-64 when computed."""

    found: bool
    copied: bool
    header: memoryview
    payload_checksum: int | None


@dataclass(slots=True)
class Exchanged:
    """What an exchange did with GETs ``0..n-1``: ``landed`` answers the first ones, in
    order; ``replies`` the next ones, as redis-py's parser returned them (None for nil, the
    value's bytes, or the ``ResponseError`` of an error reply), or ``NOT_SENT``; the rest
    were not sent, or, with ``fault``, sent and unanswered."""

    landed: list[Landed] = field(default_factory=list)
    replies: list[object] = field(default_factory=list)
    fault: Exception | None = None

    @property
    def answered(self) -> int:
        return len(self.landed) + len(self.replies)


def available() -> bool:
    """Whether exchanges can run here: the native module is built and hiredis installed."""
    return native.socket_exchanger() is not None and hiredis is not None


def exchange(
    pool: ConnectionPool,
    server_keys: Sequence[bytes],
    outs: Sequence[memoryview],
    cells: Sequence[bytearray],
    bounce: memoryview,
    checksum: bool,
) -> Exchanged | None:
    """GET each of ``server_keys`` into ``outs`` under the claim cells ``cells`` (see the
    module docstring), over one connection of ``pool``; None, with nothing sent, where the
    connection cannot (TLS, whose socket decrypts in Python; a parser holding bytes). Each
    value must be ``HEADER_BYTES`` + its out's length; ``bounce`` holds any out."""
    exchanger, said = native.socket_exchanger(), native.socket_statuses()
    if exchanger is None or said is None:
        return None
    try:
        connection = pool.get_connection()
    except Exception as exc:  # the server did not answer: the caller's breaker hears of it
        return Exchanged(fault=exc)
    try:
        sock = getattr(connection, "_sock", None)
        timeout_ms = readinto.native_timeout_ms(sock)
        reader = getattr(getattr(connection, "_parser", None), "_reader", None)
        if (
            timeout_ms is None
            or hiredis is None
            or not isinstance(reader, hiredis.Reader)
            or reader.has_data()
        ):
            return None
        try:
            connection.check_health()  # the PING a GET would send first, when one is due
        except Exception as exc:
            connection.disconnect()
            return Exchanged(fault=exc)
        try:
            return _exchange_on(
                connection, sock, timeout_ms, reader, exchanger, said, server_keys, outs,
                cells, bounce, checksum, _lock_of(pool) if ONE_AT_A_TIME else None,
            )  # fmt: skip
        except BaseException:
            connection.disconnect()  # replies may still be on the way: never back to the pool
            raise
    finally:
        pool.release(connection)


def _exchange_on(
    connection: Connection,
    sock: socket.socket,
    timeout_ms: int,
    reader: hiredis.Reader,
    exchanger: native.SocketExchanger,
    said: native.SocketStatuses,
    server_keys: Sequence[bytes],
    outs: Sequence[memoryview],
    cells: Sequence[bytearray],
    bounce: memoryview,
    checksum: bool,
    lock: object | None,
) -> Exchanged:
    requests = [b"".join(connection.pack_command("GET", key)) for key in server_keys]
    lines = [b"$%d\r\n" % (HEADER_BYTES + out.nbytes) for out in outs]
    headers = memoryview(bytearray(HEADER_BYTES * len(server_keys)))
    window = max(1, WINDOW_BYTES // (HEADER_BYTES + max(out.nbytes for out in outs)))
    status, decided, settled, error, unparsed, answers = exchanger(
        sock.fileno(),
        requests,
        lines,
        headers,
        bounce,
        list(outs),
        list(cells),
        window,
        checksum,
        timeout_ms,
        lock,
    )
    done = Exchanged(
        landed=[
            Landed(
                landed != said.get_nil,
                landed == said.get_copied,
                headers[i * HEADER_BYTES : (i + 1) * HEADER_BYTES],
                payload_checksum,
            )
            for i, (landed, payload_checksum) in enumerate(answers[:settled])
        ]
    )
    where = f"{connection.host}:{connection.port}"
    if status == said.other_reply:
        reader.feed(unparsed)
        for landed, _ in answers[settled:decided]:
            if landed == said.get_not_sent:
                done.replies.append(NOT_SENT)
                continue
            try:
                done.replies.append(connection.read_response())
            except ResponseError as reply:  # an error reply: the connection is fine
                done.replies.append(reply)
            except Exception as exc:  # redis-py has disconnected it
                done.fault = exc
                break
    elif status != said.done:
        connection.disconnect()
        done.fault = _fault(status, error, where, said)
    if done.fault is None and connection.health_check_interval:
        connection.next_health_check = time.monotonic() + connection.health_check_interval
    return done


def _fault(status: int, error: int, where: str, said: native.SocketStatuses) -> Exception:
    """redis-py's exception for what the exchange ran into (as its own reads raise them)."""
    if status == said.peer_closed:
        return RedisConnectionError("Connection closed by server.")
    if status == said.timed_out:
        return RedisTimeoutError(f"Timeout reading from {where}")
    if status == said.bad_trailer:
        return InvalidResponse("Protocol Error: a bulk string does not end in CRLF")
    reason = (error, os.strerror(error))
    return RedisConnectionError(f"Error while reading from {where} : {reason}")
