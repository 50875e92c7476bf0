"""The native socket receive (kvtier.native._sockread): fills buffers in turn, and says why it
stopped short (the peer closed, no data within the timeout, a socket error) with what arrived.
Its point (one GIL hand-over per value beside a busy Python thread) is measured by
``python -m benchmarks shared-busy``, not here."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kvtier import native

BUILDABLE = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
receive = native.socket_receiver()
needs_native = pytest.mark.skipif(receive is None, reason="kvtier.native._sockread is not built")


@pytest.mark.skipif(not BUILDABLE, reason="no C compiler: nothing to build here")
def test_the_receiver_is_built_in_a_clone_with_a_compiler() -> None:
    assert native.socket_receiver.__wrapped__() is not None, (
        "kvtier.native._sockread is not built: run `bash scripts/setup.sh` "
        "(python setup.py build_ext --inplace) in this clone"
    )


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5.0)  # non-blocking underneath, as a client socket with a timeout is
    yield ours, theirs
    ours.close()
    theirs.close()


def _send_later(sock: socket.socket, chunks: list[bytes], gap_s: float = 0.01) -> threading.Thread:
    def send() -> None:
        for chunk in chunks:
            time.sleep(gap_s)
            sock.sendall(chunk)

    sender = threading.Thread(target=send)
    sender.start()
    return sender


@needs_native
def test_buffers_are_filled_in_turn_from_chunks_that_arrive_over_time(pair) -> None:
    ours, theirs = pair
    value = os.urandom(300_000)
    sender = _send_later(theirs, [value[:1], value[1:70_000], value[70_000:], b"\r\nNEXT"])
    payload, trailer = bytearray(len(value)), bytearray(2)
    assert receive(ours.fileno(), (payload, trailer), 5000) == (0, len(value) + 2, 0)
    sender.join()
    assert payload == value and trailer == b"\r\n"
    assert ours.recv(4) == b"NEXT"  # nothing beyond the buffers was taken


@needs_native
def test_a_peer_that_closes_first_is_eof_with_what_arrived(pair) -> None:
    ours, theirs = pair
    theirs.sendall(b"abc")
    theirs.close()
    assert receive(ours.fileno(), (bytearray(5), bytearray(2)), 1000) == (1, 3, 0)


@needs_native
def test_no_data_within_the_timeout_is_a_timeout_with_what_arrived(pair) -> None:
    ours, theirs = pair
    theirs.sendall(b"ab")
    started = time.monotonic()
    assert receive(ours.fileno(), (bytearray(5),), 200) == (2, 2, 0)
    assert 0.15 < time.monotonic() - started < 3.0


@needs_native
def test_a_socket_error_is_its_errno() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as unconnected:
        unconnected.setblocking(False)
        status, received, error = receive(unconnected.fileno(), (bytearray(4),), 100)
    assert (status, received) == (3, 0) and error == errno.ENOTCONN


@needs_native
def test_only_a_tuple_of_writable_buffers_is_taken(pair) -> None:
    ours, _ = pair
    with pytest.raises(TypeError):
        receive(ours.fileno(), [bytearray(1)], 100)  # type: ignore[arg-type]
    with pytest.raises(BufferError):
        receive(ours.fileno(), (b"read-only",), 100)  # type: ignore[arg-type]
