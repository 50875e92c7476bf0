"""``DiskStore``: block records as files on a local file system, shared by processes.

Layout: see kvtier.store.layout. Index: see kvtier.store.index. File I/O: kvtier.store.io.

Writing a record (``put``), and what a crash at each step leaves behind:

1. Reserve: one index transaction checks the cap, evicts LRU records down to the low
   watermark if the new record would cross it (their rows leave the index, their file
   names enter ``trash``) and inserts a *pending* row charging the record's bytes.
   Crash after: a pending row of a dead session. The next open (or ``refresh``) of any
   process sees the session's lock is free and drops the row, freeing its bytes.
2. Unlink the evicted files, then forget their trash entries. Crash between: trash
   entries of a dead session; reclaimed (files unlinked) like pending rows.
3. Write header + payload into ``tmp/<key>.<id>.<session>.tmp`` (O_EXCL, 0600), fsync per
   policy. Crash after: a temp file of a dead session, removed at the next open.
4. Rename into ``blocks/``. Crash after: the pending row of a dead session names the file;
   reclaiming the row unlinks it. A file no row names (e.g. after the index was lost) is an
   orphan that ``verify()`` reports and ``verify(fix=True)`` removes.
5. Commit: the row becomes *ready* (and older records of the key go to trash). Only now
   can any process serve it: the file always exists before the index offers it.

Cleanup that fails (an unlink on a read-only folder, an index write on a full disk) never
drops a file's name: every file under ``blocks/`` is named by a row (charged to the cap) or
by a trash entry. Files that could not be unlinked and reservations that could not be
dropped are retried with later puts; what is still left when the process ends is reclaimed
with its session.

A power cut with ``fsync="never"`` may also leave a ready row whose file is empty or torn
(the data was still in the page cache): the read checks catch it, quarantine the file and
miss. Loss of the last index commits (``synchronous=NORMAL``) can leave a ready row without
a file (a clean miss) or a file without a row (an orphan). Neither ever serves wrong data.

Reading (``get_into``): the in-memory map gives the record id; one ``preadv`` fills the
header buffer and the caller's buffer; header and payload checksum are checked. A missing
file is a clean miss (another process evicted the record, or someone deleted it); its row, if
still there, leaves the index. Anything else that fails is quarantined and leaves the index,
so no caller retries it.

Capacity: ``capacity_bytes`` caps header + payload bytes of pending and ready rows, across
all processes (the index holds the shared total). Records of another process's pending
writes count too. Transient excess on disk, bounded by one eviction batch, exists only
between a reservation and the unlink of its evicted files, or while a reader still holds an
evicted file open. Keys being read by this process are pinned: eviction skips them.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format.checksum import Buffer
from kvtier.format.namespace import Namespace
from kvtier.format.record import (
    HEADER_BYTES,
    check_key,
    decode_header,
    encode_header,
    make_header,
    verify_payload,
)
from kvtier.store import check, layout
from kvtier.store.base import BlockStore, Problem, StoreStats
from kvtier.store.index import Index, Row
from kvtier.store.io import RecordIO
from kvtier.store.quarantine import quarantine
from kvtier.store.session import Session, is_alive, reap_dead_sessions

log = logging.getLogger(__name__)

#: Default free-space floor: this share of the file system, at most FLOOR_MAX_BYTES.
FLOOR_FRACTION = 0.05
FLOOR_MAX_BYTES = 10 << 30
#: Access times are written to the index in batches of this many hits (or with the next put).
TOUCH_BATCH = 256
#: Temp files whose name names no session are removed once this old.
STRAY_TEMP_AGE_S = 3600.0
#: Errors that say nothing about the record itself: a miss, but no quarantine.
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN}


class _Entry(NamedTuple):
    record_id: int
    payload_len: int
    #: Change-log position that made this entry current (0: loaded at open).
    seq: int


class DiskStore(BlockStore):
    """Persistent, capped, verified block store in ``<root>/<namespace digest>/``.

    Several processes may open the same root and namespace at once; they share the cap and
    see each other's records after ``refresh()``. See ``BlockStore`` for the method
    contracts and the module docstring for the crash story.
    """

    def __init__(
        self,
        root: Path | str,
        namespace: Namespace,
        capacity_bytes: int,
        free_space_floor_bytes: int | None = None,
        fsync: str = "never",
        *,
        io: RecordIO | None = None,
        low_watermark: float = 0.9,
        quarantine_max_entries: int = 64,
        busy_timeout_s: float = 30.0,
    ) -> None:
        """Open (creating if needed) the namespace's folder under ``root``.

        ``capacity_bytes``: cap on header + payload bytes (one header is 4096 bytes).
        ``free_space_floor_bytes``: keep at least this much free on the file system, evicting
        if needed; default 5% of the file system, at most 10 GiB. ``fsync``: "never",
        "data" or "always" (kvtier.store.io). ``io``: replaces the file I/O, fsync policy
        included (the fault-injection seam). ``low_watermark``: eviction empties down to
        this share of the cap. Raises ``ConfigError`` for bad values or an unsafe root.
        """
        if capacity_bytes <= HEADER_BYTES:
            raise ConfigError(
                f"disk tier: capacity_bytes={capacity_bytes}; give a size such as '64GiB'"
            )
        if not 0 < low_watermark <= 1:
            raise ConfigError(f"disk tier: low_watermark={low_watermark}; use 0 < x <= 1, e.g. 0.9")
        self.namespace = namespace
        self.capacity_bytes = capacity_bytes
        self._low_watermark_bytes = int(capacity_bytes * low_watermark)
        self._quarantine_max = quarantine_max_entries
        self._digest = namespace.digest()
        self.root = Path(root).absolute()
        self.namespace_dir = self.root / namespace.digest_hex()
        layout.make_private_dir(self.root, "root")
        layout.make_private_dir(self.namespace_dir, "namespace folder")
        for sub in (layout.BLOCKS, layout.TMP, layout.SESSIONS, layout.QUARANTINE):
            layout.make_private_dir(self.namespace_dir / sub, "store folder")
        self._check_namespace_file()
        if free_space_floor_bytes is None:
            st = os.statvfs(self.namespace_dir)
            fs_bytes = st.f_blocks * st.f_frsize
            free_space_floor_bytes = min(int(fs_bytes * FLOOR_FRACTION), FLOOR_MAX_BYTES)
        self.free_space_floor_bytes = free_space_floor_bytes
        self._io = io if io is not None else RecordIO(fsync)
        self._lock = threading.Lock()
        self._mem: dict[bytes, _Entry] = {}
        self._seq = 0
        self._pins: Counter[bytes] = Counter()
        self._touches: dict[bytes, int] = {}
        # Cleanup that failed (read-only folder, full disk, EIO) and is retried with later
        # puts: trashed files not unlinked yet, reservations not dropped yet.
        self._retry_trash: set[str] = set()
        self._retry_aborts: set[int] = set()
        self._stats = StoreStats()
        self._closed = False
        self._session = Session(self.namespace_dir)
        try:
            self._index = self._open_index(busy_timeout_s)
            self._clean_temp()
            self._reclaim_dead()
            reap_dead_sessions(self.namespace_dir)
            self._index.trim_changes()
            self._reload()
        except BaseException:
            self._session.close()
            raise
        log.info(
            "disk tier: opened %s (%d records, %d/%d bytes used, floor %d, fsync %s)",
            self.namespace_dir,
            len(self._mem),
            self.used_bytes(),
            capacity_bytes,
            free_space_floor_bytes,
            self._io.fsync,
        )

    # -- BlockStore --------------------------------------------------------------------------

    def put(self, key: bytes, payload: Buffer) -> bool:
        check_key(key)
        view = memoryview(payload)
        record_bytes = HEADER_BYTES + view.nbytes
        if self._closed or record_bytes > self.capacity_bytes:
            return self._put_failed(key, "larger than the cap" if not self._closed else "closed")
        if self._retry_trash or self._retry_aborts:
            self._retry_cleanup()
        header = encode_header(make_header(self._digest, key, view))
        try:
            reservation = self._index.reserve(
                key,
                record_bytes,
                self.capacity_bytes,
                self._low_watermark_bytes,
                self._floor_deficit(record_bytes),
                self._pinned(),
                self._take_touches(),
            )
        except (sqlite3.Error, OSError) as exc:
            return self._put_failed(key, f"index: {exc}")
        if reservation is None:
            return self._put_failed(key, "no room: nothing left to evict")
        record_id = reservation.record_id
        self._forget_rows(reservation.evicted)
        self._bump(evictions=len(reservation.evicted))
        self._empty_trash(r.path for r in reservation.evicted)
        final = self.namespace_dir / layout.record_name(key, record_id)
        temp = self.namespace_dir / layout.temp_name(key, record_id, self._session.session_id)
        try:
            self._io.write_temp(temp, header, view)
            self._io.publish(temp, final)
            committed = self._index.commit(record_id, key)
        except (OSError, sqlite3.Error) as exc:
            self._discard_write(record_id, temp, final)
            return self._put_failed(key, str(exc))
        if committed is None:
            self._discard_write(record_id, temp, final)
            return self._put_failed(key, "reservation was reclaimed")
        superseded, seq = committed
        with self._lock:
            current = self._mem.get(key)
            if current is None or current.seq < seq:
                self._mem[key] = _Entry(record_id, view.nbytes, seq)
            self._stats.puts += 1
            self._stats.bytes_written += record_bytes
        self._empty_trash(r.path for r in superseded)
        return True

    def get_into(self, key: bytes, out: memoryview) -> bool:
        out = memoryview(out)
        with self._lock:
            entry = None if self._closed else self._mem.get(key)
            if entry is None or out.nbytes != entry.payload_len:
                self._stats.misses += 1
                return False
            self._pins[key] += 1
        relative = layout.record_name(key, entry.record_id)
        try:
            header = decode_header(
                self._io.read_into(self.namespace_dir / relative, out),
                self._digest,
                key,
                entry.payload_len,
            )
            verify_payload(header, out)
        except FileNotFoundError:
            # Evicted or replaced by another process (its row is already gone), or deleted
            # behind the store's back: drop the row too, so its bytes leave the cap and no
            # later refresh (which replays this record's commit) offers the key again.
            self._drop_missing(key, entry.record_id)
            return self._missed()
        except CorruptRecordError as exc:
            self._quarantine(key, entry.record_id, exc.reason, str(exc))
            return self._missed()
        except OSError as exc:
            if exc.errno in _TRANSIENT:
                log.warning("disk tier: read of %s failed, will retry later: %s", relative, exc)
            else:
                self._quarantine(key, entry.record_id, "io_error", str(exc))
            return self._missed()
        finally:
            with self._lock:
                self._pins[key] -= 1
                if not self._pins[key]:
                    del self._pins[key]
        with self._lock:
            self._stats.hits += 1
            self._stats.bytes_read += entry.payload_len
            self._touches[key] = time.time_ns()
            flush = len(self._touches) >= TOUCH_BATCH
        if flush:
            self._flush_touches()
        return True

    def contains(self, key: bytes) -> bool:
        return key in self._mem

    def delete(self, key: bytes) -> bool:
        check_key(key)
        if self._closed:
            return False
        try:
            rows = self._index.remove_key(key)
        except sqlite3.Error as exc:
            log.warning("disk tier: delete failed: %s", exc)
            return False
        with self._lock:
            self._mem.pop(key, None)
        self._empty_trash(r.path for r in rows)
        return bool(rows)

    def keys(self) -> Iterator[bytes]:
        with self._lock:
            return iter(list(self._mem))

    def payload_len(self, key: bytes) -> int | None:
        entry = self._mem.get(key)
        return None if entry is None else entry.payload_len

    def used_bytes(self) -> int:
        if self._closed:
            return 0
        try:
            return self._index.used_bytes()
        except sqlite3.Error as exc:
            log.warning("disk tier: index unreadable, usage unknown: %s", exc)
            return self.capacity_bytes

    def stats(self) -> StoreStats:
        with self._lock:
            return self._stats.copy()

    def refresh(self) -> int:
        """Apply other processes' changes to the in-memory map and reclaim dead writers.

        Costs one indexed query when nothing changed; returns the number of changes seen.
        """
        if self._closed:
            return 0
        try:
            self._reclaim_dead()
            changes = self._index.changes_since(self._seq)
            if changes is None:
                return self._reload()
        except (sqlite3.Error, OSError) as exc:
            log.warning("disk tier: refresh failed, keeping the current view: %s", exc)
            return 0
        with self._lock:
            for change in changes:
                current = self._mem.get(change.key)
                if change.ready and (current is None or current.seq < change.seq):
                    self._mem[change.key] = _Entry(change.record_id, change.payload_len, change.seq)
                elif not change.ready and current and current.record_id == change.record_id:
                    del self._mem[change.key]
            if changes:
                self._seq = max(self._seq, changes[-1].seq)
        return len(changes)

    def verify(self, fix: bool = False) -> list[Problem]:
        if self._closed:
            raise ValueError("verify() on a closed store; open it again")
        self._flush_touches()
        problems = check.StoreCheck(
            self.namespace_dir,
            self.namespace,
            self._index,
            self._io,
            self._session.session_id,
            self._quarantine_max,
            fix,
        ).run()
        if fix:
            self._reload()
        return problems

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._mem = {}
        self._flush_touches()
        self._index.close()
        self._session.close()

    # -- extras ------------------------------------------------------------------------------

    def record_path(self, key: bytes) -> Path | None:
        """The file currently holding ``key``'s record (as this process knows it), or None."""
        entry = self._mem.get(key)
        if entry is None:
            return None
        return self.namespace_dir / layout.record_name(key, entry.record_id)

    # -- internals ---------------------------------------------------------------------------

    def _check_namespace_file(self) -> None:
        path = self.namespace_dir / layout.NAMESPACE_FILE
        try:
            fd = layout.open_private_file(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            layout.write_small_file(path, self.namespace.to_json().encode())
            return
        try:
            text = os.read(fd, 1 << 20).decode("utf-8", "replace")
        finally:
            os.close(fd)
        try:
            stored = Namespace.from_json(text)
        except ConfigError as exc:
            log.warning("disk tier: %s unreadable (%s); rewriting it", path, exc)
            layout.write_small_file(path, self.namespace.to_json().encode())
            return
        if stored != self.namespace:
            raise ConfigError(
                f"disk tier: {path} describes namespace {stored.digest_hex()}, but the folder is "
                f"named for {self.namespace.digest_hex()}; remove the folder {self.namespace_dir}"
            )

    def _open_index(self, busy_timeout_s: float) -> Index:
        path = self.namespace_dir / layout.INDEX_FILE
        try:
            os.close(layout.open_private_file(path, os.O_RDWR | os.O_CREAT))
        except OSError as exc:
            raise ConfigError(
                f"disk tier: cannot open the index {path} ({exc}); it must be a regular file "
                f"owned by this user: remove it and the store rebuilds an empty one"
            ) from None
        try:
            return Index(path, self._session.session_id, busy_timeout_s)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            log.error("disk tier: index %s is damaged (%s); starting an empty one", path, exc)
        stamp = time.time_ns()
        for suffix in ("", "-wal", "-shm"):
            damaged = path.with_name(path.name + suffix)
            if damaged.exists():
                os.rename(
                    damaged, self.namespace_dir / layout.QUARANTINE / f"index{suffix}.{stamp}"
                )
        # Its records are now unaccounted for: remove them rather than exceed the cap.
        shutil.rmtree(self.namespace_dir / layout.BLOCKS)
        layout.make_private_dir(self.namespace_dir / layout.BLOCKS, "store folder")
        os.close(layout.open_private_file(path, os.O_RDWR | os.O_CREAT))
        return Index(path, self._session.session_id, busy_timeout_s)

    def _reload(self) -> int:
        rows, seq = self._index.load_ready()
        make = _Entry._make
        mem = {key: make((record_id, size, 0)) for key, record_id, size in rows}
        with self._lock:
            self._mem, self._seq = mem, seq
        return len(mem)

    def _clean_temp(self) -> None:
        own = self._session.session_id
        for entry in os.scandir(self.namespace_dir / layout.TMP):
            session = layout.temp_session(entry.name)
            if session == own:
                continue
            if session is None:
                try:
                    age_s = time.time() - entry.stat(follow_symlinks=False).st_mtime
                except FileNotFoundError:  # removed by another process since the listing
                    continue
                stale = age_s > STRAY_TEMP_AGE_S
            else:
                stale = not is_alive(self.namespace_dir, session)
            if stale:
                self._io.remove(Path(entry.path))

    def _reclaim_dead(self) -> None:
        """Drop pending rows and trash of dead sessions: one query, plus one lock probe per
        other session that has a write in flight."""
        own = self._session.session_id
        dead = [
            s
            for s in self._index.writer_sessions()
            if s != own and not is_alive(self.namespace_dir, s)
        ]
        pending, trash = self._index.reclaim(dead)  # pending rows' files are in ``trash``
        for row in pending:
            self._io.remove(
                self.namespace_dir / layout.temp_name(row.key, row.record_id, row.session)
            )
        if pending:
            log.info("disk tier: reclaimed %d unfinished writes of dead processes", len(pending))
        self._empty_trash(trash)

    def _empty_trash(self, paths: Iterable[str]) -> None:
        """Unlink trashed files, then forget their trash entries.

        A file that cannot be unlinked (read-only folder, EIO) keeps its entry and is retried
        with the next batch: it stays named, never an orphan outside the cap.
        """
        with self._lock:
            paths = list(dict.fromkeys([*paths, *self._retry_trash]))
            self._retry_trash.clear()
        if not paths:
            return
        gone = [p for p in paths if self._io.remove(self.namespace_dir / p)]
        if len(gone) < len(paths):
            with self._lock:
                self._retry_trash.update(set(paths).difference(gone))
        try:
            self._index.trash_done(gone)
        except sqlite3.Error as exc:
            log.warning("disk tier: could not clear trash entries (retried at next open): %s", exc)

    def _discard_write(self, record_id: int, temp: Path, final: Path) -> None:
        """Undo a failed put: the reservation leaves the index, its file name goes to trash.

        Rejected: unlinking the published file, then dropping the row. If the unlink fails
        the file is left unnamed, outside the cap; if dropping the row fails (a full disk
        refuses index writes too) its bytes stay reserved for the life of the session.
        Both are retried instead.
        """
        self._io.remove(temp)  # if it stays, it names this session: removed after it ends
        try:
            trashed = self._index.abort(record_id)
        except sqlite3.Error as exc:
            log.warning("disk tier: could not drop reservation %d (retried): %s", record_id, exc)
            with self._lock:
                self._retry_aborts.add(record_id)
            return
        if trashed:
            self._empty_trash(trashed)
        else:  # another process reclaimed the row (and trashed the name) already
            self._io.remove(final)

    def _retry_cleanup(self) -> None:
        """Retry reservations that could not be dropped and files that could not be unlinked."""
        with self._lock:
            aborts, self._retry_aborts = self._retry_aborts, set()
        trashed: list[str] = []
        for record_id in aborts:
            try:
                trashed += self._index.abort(record_id)
            except sqlite3.Error:
                with self._lock:
                    self._retry_aborts.add(record_id)
        self._empty_trash(trashed)

    def _quarantine(self, key: bytes, record_id: int, reason: str, detail: str) -> None:
        relative = layout.record_name(key, record_id)
        moved = quarantine(
            self.namespace_dir,
            relative,
            f"{key.hex()}.{record_id}",
            reason,
            detail,
            self._quarantine_max,
        )
        # Neither moved nor removed (read-only folder): keep the file named, in trash.
        stuck = moved is None and os.path.lexists(self.namespace_dir / relative)
        try:
            self._index.remove_records([record_id], trash=stuck)
        except sqlite3.Error as exc:
            log.warning("disk tier: could not drop quarantined record from the index: %s", exc)
        else:
            if stuck:
                with self._lock:
                    self._retry_trash.add(relative)
        self._forget(key, record_id)
        with self._lock:
            self._stats.corrupt[reason] = self._stats.corrupt.get(reason, 0) + 1
            self._stats.quarantined += moved is not None

    def _floor_deficit(self, record_bytes: int) -> int:
        if self.free_space_floor_bytes <= 0:
            return 0
        st = os.statvfs(self.namespace_dir)
        return max(0, self.free_space_floor_bytes - (st.f_bavail * st.f_frsize - record_bytes))

    def _pinned(self) -> set[bytes]:
        with self._lock:
            return set(self._pins)

    def _take_touches(self) -> dict[bytes, int]:
        with self._lock:
            touches, self._touches = self._touches, {}
        return touches

    def _flush_touches(self) -> None:
        touches = self._take_touches()
        try:
            self._index.touch(touches)
        except sqlite3.Error as exc:
            log.debug("disk tier: access times not recorded: %s", exc)

    def _forget(self, key: bytes, record_id: int) -> None:
        with self._lock:
            entry = self._mem.get(key)
            if entry is not None and entry.record_id == record_id:
                del self._mem[key]

    def _drop_missing(self, key: bytes, record_id: int) -> None:
        try:
            self._index.remove_records([record_id])
        except sqlite3.Error as exc:
            log.warning("disk tier: could not drop a record whose file is gone: %s", exc)
        self._forget(key, record_id)

    def _forget_rows(self, rows: list[Row]) -> None:
        for row in rows:
            self._forget(row.key, row.record_id)

    def _missed(self) -> bool:
        self._bump(misses=1)
        return False

    def _put_failed(self, key: bytes, why: str) -> bool:
        log.warning("disk tier: put of %s failed: %s", key.hex()[:16], why)
        self._bump(put_failures=1)
        return False

    def _bump(self, **increments: int) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self._stats, name, getattr(self._stats, name) + value)
