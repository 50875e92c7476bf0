"""Processes that die at a chosen step of a put (run under multiprocessing "spawn").

They live in their own module so a spawned child can import them (tests.support.crash).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvtier.format.checksum import Buffer
from kvtier.store import DiskStore, RecordIO, RecordWriter
from tests.support.store import disk_capacity, key_of, make_namespace, payload_of

CRASH_EXIT_CODE = 17
CAPACITY_RECORDS = 4


class CrashingWriter(RecordWriter):
    """Exits the process, without any cleanup, at step ``at`` of a write."""

    def __init__(self, at: str, occurrence: int = 1) -> None:
        """Exit at the ``occurrence``-th time step ``at`` is reached once armed."""
        super().__init__()
        self.at = at
        self.armed = True
        self._left = occurrence

    def _maybe_crash(self, step: str) -> None:
        if self.armed and self.at == step:
            self._left -= 1
            if not self._left:
                os._exit(CRASH_EXIT_CODE)

    def write_temp(self, path: Path, header: bytes, payload: Buffer) -> None:
        self._maybe_crash("before_write")
        super().write_temp(path, header, payload)
        self._maybe_crash("after_temp_write")

    def publish(self, temp: Path, final: Path) -> None:
        super().publish(temp, final)
        self._maybe_crash("after_rename")

    def remove_many(self, paths: list[Path]) -> list[bool]:
        gone = []
        for path in paths:  # one at a time: the crash comes between two unlinks
            if path.suffix == ".kvb":
                self._maybe_crash("before_evict_unlink")
            gone += super().remove_many([path])
        return gone


def open_store(root: str, writer: RecordWriter | None = None) -> DiskStore:
    return DiskStore(
        root,
        make_namespace(),
        disk_capacity(CAPACITY_RECORDS),
        free_space_floor_bytes=0,
        io=None if writer is None else RecordIO(writer),
    )


def fill_then_crash(root: str, at: str, prefill: int) -> None:
    """Store ``prefill`` records normally, then crash at step ``at`` of the next put."""
    writer = CrashingWriter(at)
    writer.armed = False
    store = open_store(root, writer)
    for i in range(prefill):
        store.put(key_of(100 + i), payload_of(100 + i))
    writer.armed = True
    store.put(key_of(1), payload_of(1))
    raise SystemExit(f"did not crash at {at}")


def put_many_then_crash(root: str, at: str, records: int) -> None:
    """Store ``records`` records in one ``put_many`` and crash at the last record's step
    ``at`` (its last rename: every file of the batch published, nothing committed)."""
    store = open_store(root, CrashingWriter(at, occurrence=records))
    store.put_many([key_of(i) for i in range(records)], [payload_of(i) for i in range(records)])
    raise SystemExit(f"did not crash at {at}")
