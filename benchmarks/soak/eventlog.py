"""The soak's event log, writer side: one JSON object per line, flushed per line (EVENTS.md;
``benchmarks.soak.events`` reads it)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any


class EventLog:
    """Thread-safe writer of ``events.jsonl``; ``t`` is seconds since ``start()`` (monotonic).

    Lines are written as events complete, so a ``fault`` (emitted when it ends, carrying its
    start ``t`` and ``end_t``) may follow requests that started after it: readers sort by ``t``
    where order matters.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        #: Lines written per ``type``.
        self.counts: Counter[str] = Counter()

    def start(self) -> None:
        """Make now the run's ``t = 0`` (the load phase starts)."""
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def emit(self, event_type: str, /, t: float | None = None, **fields: Any) -> None:
        # Positional-only: ``kind`` and ``type``-like names are event fields (a fault's kind).
        record = {"type": event_type, "t": round(self.now() if t is None else t, 4), **fields}
        line = json.dumps(record, default=str)
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line + "\n")
            self._file.flush()
            self.counts[event_type] += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()
