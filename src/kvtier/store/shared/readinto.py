"""Reading a GET reply straight into buffers the caller owns: no new ``bytes`` per record.

redis-py returns every GET as a new ``bytes``: hiredis reads the socket in 64 KiB chunks,
copies them into its reader, then into a fresh object of the value's size. For a 5.6 MiB
record that is a fresh allocation (page faults included) and two copies per load, and
``get_into`` then copied the payload once more. A ``ReadInto`` instead names where the value
lands: its first ``head_bytes`` (the record header) in a small buffer of its own, the rest in
the caller's buffer, and ``read_reply_into`` fills them with ``recv_into``.

Only the one reply fully understood here is read raw: a bulk string of exactly the expected
length, ``$<len>\\r\\n`` + value + ``\\r\\n``. Anything else (nil, an error reply such as MOVED
or ASK, a value of another length, a RESP3 push frame) differs from the expected first line
within it, because that line ends in ``\\r\\n`` and a digit never equals ``\\r``. At the first
differing byte the bytes read so far go to ``feed`` (the connection's hiredis reader), which
then reads the rest of the reply as it always does: redis-py raises, redirects and returns
exactly what a plain GET would. Every byte read is either in the caller's buffers (the line
matched) or given to the parser; none is dropped or kept aside, and no recv asks for more than
the expected value still lacks, so nothing of a later reply is ever read into the buffers.

The value and its trailer are received in one GIL-free native call where the socket is a plain
one (``kvtier.native.socket_receiver``; a TLS socket decrypts in Python, and goes through the
``recv_into`` loop): a loop takes the GIL back after every chunk the kernel hands over, and
beside a busy Python thread (an engine's loop) each of those can wait out the interpreter's
switch interval, which then takes most of the read's time (docs/shared-tier.md, "Beside a
busy Python thread").

A short read (EOF) raises redis-py's ``ConnectionError``, a bad trailer ``InvalidResponse``;
socket errors and timeouts propagate for the connection to map (and disconnect). The buffers
then hold part of a value: the caller must only land values where a partial write is harmless.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from kvtier import native

#: Keyword argument of ``execute_command("GET", key, ...)`` carrying the ``ReadInto``; redis-py
#: hands command options down to the connection's ``send_command`` unchanged.
OPTION = "kvtier_read_into"
# redis-py's own text for a reply cut short by the server (redis._parsers.socket).
_CLOSED = "Connection closed by server."


class _Socket(Protocol):
    def recv_into(self, buffer: memoryview, nbytes: int = ..., /) -> int: ...


class ReadInto:
    """Where one GET's value should land; filled completely, or left for the parser.

    The value must be exactly ``head_bytes + payload.nbytes`` bytes long. ``head`` then holds
    its first ``head_bytes`` and ``payload`` the rest.
    """

    __slots__ = ("_buffer", "line", "payload")

    def __init__(self, head_bytes: int, payload: memoryview) -> None:
        self.payload = payload
        #: The bulk string's first line, as the server sends it for the expected length.
        self.line = b"$%d\r\n" % (head_bytes + payload.nbytes)
        self._buffer = bytearray(len(self.line) + head_bytes)

    @property
    def head(self) -> memoryview:
        """The value's first ``head_bytes`` (valid once ``read_reply_into`` returned True)."""
        return memoryview(self._buffer)[len(self.line) :]


def read_reply_into(
    sock: _Socket, request: ReadInto, feed: Callable[[bytearray, int], None]
) -> bool:
    """Read one reply from ``sock``: True if it was the expected bulk string, now in
    ``request``; False if it is another reply, whose first ``n`` bytes were passed to
    ``feed(buffer, n)`` (the rest is still on the socket)."""
    buffer = request._buffer
    view = memoryview(buffer)
    line = request.line
    got = 0
    while got < len(buffer):
        n = sock.recv_into(view[got:])
        if not n:
            raise RedisConnectionError(_CLOSED)
        got += n
        seen = min(got, len(line))
        if view[:seen] != line[:seen]:
            feed(buffer, got)
            return False
    trailer = bytearray(2)
    _recv_value(sock, request.payload, trailer)
    if trailer != b"\r\n":
        raise InvalidResponse(f"Protocol Error: bulk string ends in {bytes(trailer)!r}")
    return True


def _recv_value(sock: _Socket, payload: memoryview, trailer: bytearray) -> None:
    """Fill ``payload`` then ``trailer`` from ``sock``: in one native call where it is a plain
    socket, else by ``recv_into``; the same exceptions either way."""
    receive, said = native.socket_receiver(), native.socket_statuses()
    timeout_ms = native_timeout_ms(sock)
    if receive is None or said is None or timeout_ms is None:
        _recv_exactly(sock, payload)
        _recv_exactly(sock, memoryview(trailer))
        return
    status, _, error = receive(sock.fileno(), (payload, trailer), timeout_ms)
    if status == said.peer_closed:
        raise RedisConnectionError(_CLOSED)
    if status == said.timed_out:
        raise TimeoutError("timed out")  # what a plain socket's recv_into raises
    if status == said.error:
        raise OSError(error, os.strerror(error))


def native_timeout_ms(sock: object) -> int | None:
    """How long a native receive on ``sock`` may wait for data, as its Python calls would
    (milliseconds, -1 without bound); None where native code cannot read it: a TLS socket
    (``SSLSocket`` subclasses ``socket``, and decrypts in Python) or a stand-in."""
    if type(sock) is not socket.socket:
        return None
    timeout = sock.gettimeout()
    return -1 if timeout is None else math.ceil(timeout * 1000)


def _recv_exactly(sock: _Socket, view: memoryview) -> None:
    pos = 0
    while pos < view.nbytes:
        n = sock.recv_into(view[pos:])
        if not n:
            raise RedisConnectionError(_CLOSED)
        pos += n
