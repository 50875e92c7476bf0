"""A loopback TCP proxy in front of a server that cuts or stalls a reply part-way through.

Faults enter here rather than by patching the client: the client under test talks to the real
server through real sockets, and the proxy breaks the server-to-client stream after a chosen
number of bytes, once (``cut_after``: both sockets closed, the client reads EOF; ``stall_after``:
nothing more is forwarded on that connection until the client gives up and closes it).
Connections made after the fault are forwarded untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass


@dataclass
class _Fault:
    kind: str  # "cut" or "stall"
    remaining: int  # server-to-client bytes still forwarded before the fault strikes


class FaultyProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``upstream_port``; ``close`` stops it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._fault: _Fault | None = None
        self._sockets: list[socket.socket] = []
        self._closed = False
        #: Faults that struck so far.
        self.struck = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cut_after(self, nbytes: int) -> None:
        """Close the connection after forwarding ``nbytes`` more server-to-client bytes."""
        with self._lock:
            self._fault = _Fault("cut", nbytes)

    def stall_after(self, nbytes: int) -> None:
        """Stop forwarding on the connection after ``nbytes`` more server-to-client bytes."""
        with self._lock:
            self._fault = _Fault("stall", nbytes)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_client: bool) -> None:
        try:
            while chunk := src.recv(1 << 16):
                if to_client:
                    chunk, fault = self._take(chunk)
                    if chunk:
                        dst.sendall(chunk)
                    if fault == "cut":
                        break
                    if fault == "stall":
                        while src.recv(1 << 16):  # swallow the rest until the client gives up
                            pass
                        break
                else:
                    dst.sendall(chunk)
        except OSError:
            pass
        _close(src)
        _close(dst)

    def _take(self, chunk: bytes) -> tuple[bytes, str | None]:
        """The part of ``chunk`` to forward, and the fault that strikes after it (if any)."""
        with self._lock:
            fault = self._fault
            if fault is None:
                return chunk, None
            if len(chunk) < fault.remaining:
                fault.remaining -= len(chunk)
                return chunk, None
            self._fault = None
            self.struck += 1
            return chunk[: fault.remaining], fault.kind


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
