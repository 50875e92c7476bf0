"""When each record was last loaded, written to the index by a thread of its own.

Eviction is least recently used, so every hit's time must reach the index; writing it there
gives the GIL up at each SQLite step, and while another thread runs Python (an engine's
scheduler and model loop) every return waits for it, up to the interpreter's switch interval.
Written by the loading thread, one batch of access times (a transaction of many SQLite
steps, each a GIL hand-over) would stall that block's load by seconds beside a busy Python
thread (``python -m benchmarks disk-read --busy-python-thread``), and a restore waits for its
slowest block. So a load only notes the time here; a writer thread, started on the first full
batch, writes each batch.

A write that fails (the index busy past its bound) loses that batch's times: eviction is then
a little less exact, nothing else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kvtier.threads import name_os_thread

#: How long ``close`` waits for a batch being written before it gives up on it.
CLOSE_WAIT_S = 5.0


class AccessTimes:
    """Pending access times (key -> ns) and the thread that writes them in batches."""

    def __init__(self, write: Callable[[dict[bytes, int]], None], batch: int, name: str) -> None:
        """``write`` stores a batch (it must not raise); a batch is written once ``batch``
        keys are pending; ``name`` names the writer thread."""
        self._write = write
        self._batch = batch
        self._name = name
        self._lock = threading.Lock()
        self._pending: dict[bytes, int] = {}
        self._wake = threading.Event()
        self._closed = False
        self._writer: threading.Thread | None = None

    def note(self, key: bytes) -> None:
        """``key`` was loaded now."""
        with self._lock:
            self._pending[key] = time.time_ns()
            if len(self._pending) < self._batch or self._closed:
                return
            if self._writer is None or not self._writer.is_alive():  # also after a fork
                self._writer = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._writer.start()
        self._wake.set()

    def take(self, limit: int | None = None) -> dict[bytes, int]:
        """Remove and return the pending times (at most ``limit``, oldest first)."""
        with self._lock:
            if limit is None or len(self._pending) <= limit:
                taken, self._pending = self._pending, {}
                return taken
            keys = list(self._pending)[:limit]
            return {k: self._pending.pop(k) for k in keys}

    def flush(self) -> None:
        """Write what is pending now, on the calling thread."""
        taken = self.take()
        if taken:
            self._write(taken)

    def close(self) -> None:
        """Stop the writer (waiting at most CLOSE_WAIT_S for a batch it is writing), then
        write what is left."""
        with self._lock:
            self._closed = True
            writer = self._writer
        self._wake.set()
        if writer is not None:
            writer.join(CLOSE_WAIT_S)
        self.flush()

    def _run(self) -> None:
        name_os_thread()
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            self.flush()
