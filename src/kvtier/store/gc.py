"""Operator-driven eviction over a disk root (``kvtier gc``), safe while engines serve.

Records leave as a put's evictions do: their rows move to trash (still charged) in one index
transaction, the files are unlinked, then the charge is released. A process reading one of
them keeps its open file (an unlinked file lives until closed), and running stores drop the
keys from their views at their next ``refresh()``; a key a store believed present is then a
clean miss.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from kvtier.store import layout
from kvtier.store.index import Index, Trashed, charge
from kvtier.store.inspect import UnreadableRoot
from kvtier.store.io import RecordIO
from kvtier.store.quarantine import Limits, prune
from kvtier.store.root import index_files_bytes, namespace_folders, open_index
from kvtier.store.trash import Trash


@dataclass(frozen=True)
class GcResult:
    """What one ``collect`` removed."""

    records: int
    #: Charge released by the records (sizes rounded up to 4 KiB).
    record_bytes: int
    quarantine_entries: int


def collect(
    root: Path | str,
    *,
    to_bytes: int | None = None,
    namespace: str | None = None,
    older_than_s: float | None = None,
    quarantine: bool = False,
) -> GcResult:
    """Evict least recently used records of ``root`` until its footprint (what the cap
    bounds) is at most ``to_bytes``; or every record of ``namespace`` (a digest hex); or
    every record unused for ``older_than_s`` seconds (the filters combine); and, with
    ``quarantine``, empty the quarantine. Raises ``UnreadableRoot`` for a folder without an
    index (nothing is created)."""
    root = Path(root).absolute()
    if not (root / layout.INDEX_FILE).is_file():
        raise UnreadableRoot(f"{root} holds no kvtier index ({layout.INDEX_FILE})")
    # Measured before this process opens the index (which creates its -shm and -wal), so
    # the target means what `kvtier du` showed.
    overhead = index_files_bytes(root, len(namespace_folders(root)))
    index: Index = open_index(root, f"gc{os.urandom(6).hex()}", None, 30.0)
    try:
        rows = []
        if to_bytes is not None or namespace is not None or older_than_s is not None:
            before = None if older_than_s is None else time.time_ns() - int(older_than_s * 1e9)
            trash = Trash(root, index, RecordIO())
            while True:  # a few rows per transaction keep the index's WAL small
                batch = index.evict(namespace, before, to_bytes, overhead)
                trash.empty(Trashed(r.path, "") for r in batch)
                if not batch:
                    break
                rows += batch
        dropped = 0
        if quarantine:
            dropped = prune(root, index, Limits(0, 0))
        return GcResult(len(rows), sum(charge(r.record_bytes) for r in rows), dropped)
    finally:
        index.close()
