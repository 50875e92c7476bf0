"""Operator-driven eviction over a disk root (``kvtier gc``), safe while engines serve.

Records leave as a put's evictions do: their rows move to trash (still charged) in one index
transaction, the files are unlinked, then the charge is released. A process reading one of
them keeps its open file (an unlinked file lives until closed), and running stores drop the
keys from their views at their next ``refresh()``; a key a store believed present is then a
clean miss.

A collection is a writer session like a store's: it holds a session lock (in a namespace
folder) while it runs, so its trash entries in flight belong to a live session. Without one,
``verify`` beside it reported them as ``stale_trash`` of a dead session, and engines reclaimed
them under its feet.

After a key rotation, ``keep_key_ids`` drops the sealed records of keys no longer in use:
each ready record's header (its first 4 KiB, which hold the key id in the clear) is read and
the record evicted unless its key id is kept. Plain records and records whose header cannot be
read are left alone (``verify`` is the judge of damage).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import CorruptRecordError
from kvtier.format.record import HEADER_BYTES, decode_header
from kvtier.store.disk import layout
from kvtier.store.disk.folders import folders_bytes
from kvtier.store.disk.index import PENDING, TXN_ROWS_MAX, Index, Row, Trashed, charge
from kvtier.store.disk.inspect import UnreadableRoot
from kvtier.store.disk.quarantine import Limits, prune
from kvtier.store.disk.root import index_files_bytes, namespace_folders, open_index
from kvtier.store.disk.session import Session
from kvtier.store.disk.trash import Trash
from kvtier.store.disk.writer import RecordWriter


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
    keep_key_ids: Collection[bytes] | None = None,
    writer: RecordWriter | None = None,
) -> GcResult:
    """Evict least recently used records of ``root`` until its footprint (what the cap
    bounds) is at most ``to_bytes``; or every record of ``namespace`` (a digest hex); or
    every record unused for ``older_than_s`` seconds (the filters combine); and, with
    ``quarantine``, empty the quarantine; with ``keep_key_ids``, evict every sealed record
    under another key (module docstring). ``writer``: removes the files (a test seam). Raises
    ``UnreadableRoot`` for a folder without an index (nothing is created)."""
    root = Path(root).absolute()
    if not (root / layout.INDEX_FILE).is_file():
        raise UnreadableRoot(f"{root} holds no kvtier index ({layout.INDEX_FILE})")
    folders = namespace_folders(root)
    # Measured before this process opens the index (which creates its -shm and -wal), so
    # the target means what `kvtier du` showed.
    overhead = index_files_bytes(root, len(folders)) + folders_bytes(root)
    session = _hold_session(root, namespace, folders)
    session_id = session.session_id if session is not None else f"gc{os.urandom(6).hex()}"
    try:
        index: Index = open_index(root, session_id, None, 30.0)
    except BaseException:
        if session is not None:
            session.close()
        raise
    try:
        rows = []
        if to_bytes is not None or namespace is not None or older_than_s is not None:
            before = None if older_than_s is None else time.time_ns() - int(older_than_s * 1e9)
            trash = Trash(root, index, writer if writer is not None else RecordWriter())
            while True:  # a few rows per transaction keep the index's WAL small
                batch = index.evict(namespace, before, to_bytes, overhead)
                trash.empty(Trashed(r.path, "") for r in batch)
                if not batch:
                    break
                rows += batch
            if rows:
                # The target was measured with the WAL as it was; these transactions may have
                # grown it (by up to ~100 KiB after another writer emptied it), leaving `du`
                # above the target. Emptying it restores the measured state. Rejected:
                # counting the WAL at its bound, as reservations do (evicts up to 480 KiB
                # more than asked, and a folder no engine has open has no WAL afterwards).
                index.truncate_wal()
        if keep_key_ids is not None:
            retired = [r for r in index.all_rows() if _retired(root, r, set(keep_key_ids))]
            for start in range(0, len(retired), TXN_ROWS_MAX):
                batch = retired[start : start + TXN_ROWS_MAX]
                index.remove_records([r.record_id for r in batch], trash=True)
                Trash(root, index, writer if writer is not None else RecordWriter()).empty(
                    Trashed(r.path, "") for r in batch
                )
            rows += retired
        dropped = 0
        if quarantine:
            dropped = prune(root, index, Limits(0, 0))
        return GcResult(len(rows), sum(charge(r.record_bytes) for r in rows), dropped)
    finally:
        index.close()
        if session is not None:
            session.close()


def _retired(root: Path, row: Row, keep: set[bytes]) -> bool:
    """True if ``row`` is a ready sealed record whose key id is not in ``keep``."""
    if row.state == PENDING:
        return False
    try:
        with open(root / row.path, "rb") as file:
            head = file.read(HEADER_BYTES)
        header = decode_header(head, bytes.fromhex(row.ns), row.key)
    except (OSError, ValueError, CorruptRecordError):
        return False
    return header.seal is not None and header.seal.key_id not in keep


def _hold_session(root: Path, namespace: str | None, folders: list[str]) -> Session | None:
    """This collection's liveness lock, in ``namespace``'s folder (else the first one that
    takes it). None if no folder does: a root without namespace folders has nothing to
    evict."""
    names = [namespace] if namespace in folders else []
    for name in names + folders:
        try:
            return Session(root / name)
        except FileNotFoundError:  # a folder without sessions/: not one a store opened
            continue
    return None
