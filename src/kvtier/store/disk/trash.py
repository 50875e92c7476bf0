"""The disk store's trash: unlinking files whose rows left the index, and retrying what failed.

A file leaves the index in two steps: its row moves to ``trash`` (still charged against the
cap), then the file is unlinked and the entry forgotten, releasing the charge. Cleanup that
fails (an unlink on a read-only folder, an index write on a full disk) never drops a file's
name: files that could not be unlinked and reservations that could not be dropped are
retried with later puts; what is still left when the process ends is reclaimed with its
session by the next process that opens the root.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from kvtier.store.disk.index import Index, Trashed
from kvtier.store.disk.writer import RecordWriter

log = logging.getLogger(__name__)


class Trash:
    """Empties one session's trash entries (paths relative to ``root``)."""

    def __init__(self, root: Path, index: Index, writer: RecordWriter) -> None:
        self._root = root
        self._index = index
        self._writer = writer
        self._lock = threading.Lock()
        # Cleanup that failed (read-only folder, full disk, EIO), retried with later puts.
        self._retry_entries: dict[str, Trashed] = {}
        self._retry_aborts: set[int] = set()

    def has_retries(self) -> bool:
        """True if some earlier cleanup failed and waits for ``retry``."""
        return bool(self._retry_entries or self._retry_aborts)

    def empty(self, entries: Iterable[Trashed]) -> None:
        """Unlink the entries' files (temp file first), then forget the entries.

        An entry whose file cannot be unlinked (read-only folder, EIO) stays, still charged,
        and is retried with the next batch: never an orphan outside the cap.
        """
        with self._lock:
            batch = {e.path: e for e in entries}
            batch.update(self._retry_entries)
            self._retry_entries = {}
        if not batch:
            return
        gone = self._unlink(list(batch.values()))
        if len(gone) < len(batch):
            with self._lock:
                for path in set(batch).difference(gone):
                    self._retry_entries[path] = batch[path]
        try:
            self._index.trash_done(gone)
        except sqlite3.Error as exc:
            # The files are gone but still charged: retried (unlinking again is harmless).
            log.warning("disk tier: could not clear trash entries (retried): %s", exc)
            with self._lock:
                for path in gone:
                    self._retry_entries[path] = batch[path]

    def keep(self, path: str) -> None:
        """Retry unlinking ``path`` (already a trash entry) with the next batch."""
        with self._lock:
            self._retry_entries[path] = Trashed(path, "")

    def discard_write(self, record_id: int, temp: Path, final: Path) -> None:
        """Undo a failed put: the reservation leaves the index, its files go to trash.

        Rejected: unlinking the published file, then dropping the row. If the unlink fails
        the file is left unnamed, outside the cap; if dropping the row fails (a full disk
        refuses index writes too) its bytes stay reserved for the life of the session.
        Both are retried instead.
        """
        self._writer.remove(temp)  # if it stays, it names this session: removed after it ends
        try:
            trashed = self._index.abort(record_id)
        except sqlite3.Error as exc:
            log.warning("disk tier: could not drop reservation %d (retried): %s", record_id, exc)
            with self._lock:
                self._retry_aborts.add(record_id)
            return
        if trashed:
            self.empty(trashed)
        else:  # another process reclaimed the row (and trashed the name) already
            self._writer.remove(final)

    def retry(self) -> None:
        """Retry reservations that could not be dropped and files that could not be unlinked."""
        with self._lock:
            aborts, self._retry_aborts = self._retry_aborts, set()
        trashed: list[Trashed] = []
        for record_id in aborts:
            try:
                trashed += self._index.abort(record_id)
            except sqlite3.Error:
                with self._lock:
                    self._retry_aborts.add(record_id)
        self.empty(trashed)

    def _unlink(self, entries: list[Trashed]) -> list[str]:
        """Unlink the entries' files, each entry's temp file first, in one ``remove_many``;
        the paths of the entries whose files are all gone."""
        files = [(e.path, name) for e in entries for name in (e.temp, e.path) if name]
        gone = self._writer.remove_many([self._root / name for _, name in files])
        kept = {path for (path, _), ok in zip(files, gone, strict=True) if not ok}
        return [e.path for e in entries if e.path not in kept]
