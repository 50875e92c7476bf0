"""The disk store's shared index: one SQLite database per namespace folder.

Every process that opens the folder uses the same index, so the byte cap, the LRU order and
the set of records hold across processes and restarts. WAL mode with ``synchronous=NORMAL``:
readers never wait for the writer, and a commit costs no fsync (a power cut may lose the last
commits; see the crash story in kvtier.store.disk for why that is safe).

Tables::

    records(id, key, state, record_bytes, access_ns, session)
        id       unique record id, never reused (AUTOINCREMENT), part of the file name
        state    0 pending (bytes reserved, file being written), 1 ready (servable)
        session  writer session; a pending row of a dead session is reclaimed
    totals(used_bytes)       sum of records.record_bytes, kept by triggers
    changes(seq, key, record_id, op, record_bytes)
                             log of records becoming ready (op 1) or leaving (op 0), kept
                             by triggers; other processes follow it in refresh()
    trash(path, session)     files whose rows are gone but which are not unlinked yet
    meta(name, value)        schema version, changes_floor (log trimmed below this seq)

Every write transaction is ``BEGIN IMMEDIATE`` (takes the write lock up front, so a check
and the write that depends on it cannot interleave with another process's).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvtier.format.record import HEADER_BYTES
from kvtier.store.layout import record_name

SCHEMA_VERSION = 1
PENDING, READY = 0, 1
#: Change-log rows kept for processes that have not refreshed lately.
CHANGES_KEPT = 200_000
_EVICT_SCAN_BATCH = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key BLOB NOT NULL,
    state INTEGER NOT NULL,
    record_bytes INTEGER NOT NULL,
    access_ns INTEGER NOT NULL,
    session TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_key ON records(key);
CREATE INDEX IF NOT EXISTS records_lru ON records(state, access_ns);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 0), used_bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (0, 0);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key BLOB NOT NULL,
    record_id INTEGER NOT NULL, op INTEGER NOT NULL, record_bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS trash (path TEXT PRIMARY KEY, session TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('schema_version', 1), ('changes_floor', 0);
CREATE TRIGGER IF NOT EXISTS records_added AFTER INSERT ON records BEGIN
    UPDATE totals SET used_bytes = used_bytes + NEW.record_bytes WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS records_removed AFTER DELETE ON records BEGIN
    UPDATE totals SET used_bytes = used_bytes - OLD.record_bytes WHERE id = 0;
    INSERT INTO changes(key, record_id, op, record_bytes)
        SELECT OLD.key, OLD.id, 0, OLD.record_bytes WHERE OLD.state = 1;
END;
CREATE TRIGGER IF NOT EXISTS records_ready AFTER UPDATE OF state ON records
WHEN NEW.state = 1 AND OLD.state = 0 BEGIN
    INSERT INTO changes(key, record_id, op, record_bytes)
        VALUES (NEW.key, NEW.id, 1, NEW.record_bytes);
END;
"""


class _NoRoom(Exception):
    """Raised inside a reservation to roll it back: not enough can be evicted."""


@dataclass(frozen=True, slots=True)
class Row:
    """One row of ``records``."""

    #: Unique record id (part of the file name).
    record_id: int
    #: The block key.
    key: bytes
    #: PENDING or READY.
    state: int
    #: Header + payload bytes charged against the cap.
    record_bytes: int
    #: Writer session id.
    session: str

    @property
    def path(self) -> str:
        """The record file, relative to the namespace folder."""
        return record_name(self.key, self.record_id)

    @property
    def payload_len(self) -> int:
        return self.record_bytes - HEADER_BYTES


@dataclass(frozen=True, slots=True)
class Reservation:
    """The outcome of a successful ``Index.reserve``."""

    #: Id of the new pending record.
    record_id: int
    #: Records evicted to make room: they left the index; their files are in ``trash``.
    evicted: list[Row]


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the change log."""

    #: Position in the log (increasing).
    seq: int
    #: The block key.
    key: bytes
    #: The record concerned.
    record_id: int
    #: True: the record became ready; False: it left the index.
    ready: bool
    #: Payload bytes of the record.
    payload_len: int


class Index:
    """Thread-safe access to one namespace's index (one connection behind a lock).

    Rejected: a connection per thread. SQLite admits one writer at a time anyway, and the
    store's slow work (checksums, file I/O) happens outside the index; the lock is held only
    for short transactions (see the lock-hold figures in docs/store.md).
    """

    def __init__(self, path: Path, session: str, busy_timeout_s: float = 30.0) -> None:
        self.session = session
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._lock:  # executescript commits first, so it brings its own BEGIN
                self._conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
            verdict = self._conn.execute("PRAGMA quick_check").fetchall()
            if verdict != [("ok",)]:
                raise sqlite3.DatabaseError(f"quick_check: {verdict[:3]}")
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction under the lock; rolled back on any exception."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot under the lock."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    # -- queries ---------------------------------------------------------------------------

    def used_bytes(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT used_bytes FROM totals").fetchone()[0]

    def load_ready(self) -> tuple[list[tuple[bytes, int, int]], int]:
        """(key, record id, payload length) of every ready record, and the change-log
        position they reflect. Plain tuples: this runs over every record at start-up."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT key, id, record_bytes - ? FROM records WHERE state = 1", (HEADER_BYTES,)
            ).fetchall()
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
        return rows, seq

    def changes_since(self, seq: int) -> list[Change] | None:
        """Changes after ``seq`` in order; None if the log was trimmed past it (reload)."""
        with self._read() as conn:
            floor = conn.execute("SELECT value FROM meta WHERE name='changes_floor'").fetchone()[0]
            if seq < floor:
                return None
            return [
                Change(s, k, r, bool(op), size - HEADER_BYTES)
                for s, k, r, op, size in conn.execute(
                    "SELECT seq, key, record_id, op, record_bytes FROM changes "
                    "WHERE seq > ? ORDER BY seq",
                    (seq,),
                )
            ]

    def is_ready(self, record_id: int) -> bool:
        """True if record ``record_id`` is still in the index and ready (one indexed query)."""
        with self._lock:
            return (
                self._conn.execute(
                    "SELECT 1 FROM records WHERE id = ? AND state = 1", (record_id,)
                ).fetchone()
                is not None
            )

    def all_rows(self) -> list[Row]:
        with self._lock:
            return _rows(self._conn, "1")

    def trash(self) -> list[tuple[str, str]]:
        """(path, session) of every trash entry."""
        with self._lock:
            return list(self._conn.execute("SELECT path, session FROM trash"))

    def counter_drift(self) -> tuple[int, int]:
        """(totals.used_bytes, actual sum of record_bytes)."""
        with self._read() as conn:
            used = conn.execute("SELECT used_bytes FROM totals").fetchone()[0]
            actual = conn.execute("SELECT COALESCE(SUM(record_bytes), 0) FROM records")
            return used, actual.fetchone()[0]

    # -- writes ----------------------------------------------------------------------------

    def reserve(
        self,
        key: bytes,
        record_bytes: int,
        capacity_bytes: int,
        low_watermark_bytes: int,
        extra_free_bytes: int,
        pinned: Collection[bytes],
        touches: Mapping[bytes, int],
    ) -> Reservation | None:
        """Reserve ``record_bytes`` for a new pending record of ``key``, evicting if needed.

        If the reservation would cross ``capacity_bytes``, ready records are evicted in LRU
        order (skipping ``pinned`` keys) until usage is at most ``low_watermark_bytes`` after
        the reservation; ``extra_free_bytes`` more are evicted to restore the free-space
        floor. Returns None, changing nothing, if not enough can be evicted. ``touches``
        (key -> access time) are applied first so the LRU order is current.
        """
        now = time.time_ns()
        try:
            with self._write() as conn:
                self._apply_touches(conn, touches)
                used = conn.execute("SELECT used_bytes FROM totals").fetchone()[0]
                must_free = max(used + record_bytes - capacity_bytes, extra_free_bytes)
                evicted: list[Row] = []
                if must_free > 0:
                    want = max(used + record_bytes - low_watermark_bytes, extra_free_bytes)
                    evicted = self._pick_lru(conn, want, pinned)
                    if sum(r.record_bytes for r in evicted) < must_free:
                        raise _NoRoom
                    self._remove(conn, evicted)
                cursor = conn.execute(
                    "INSERT INTO records(key, state, record_bytes, access_ns, session) "
                    "VALUES (?, 0, ?, ?, ?)",
                    (key, record_bytes, now, self.session),
                )
                return Reservation(cursor.lastrowid, evicted)
        except _NoRoom:
            return None

    def commit(self, record_id: int, key: bytes) -> tuple[list[Row], int] | None:
        """Make a pending record ready; older ready records of the key go to trash.

        Returns (superseded rows, change-log seq of this record), or None if the pending row
        is gone (reclaimed by another process that judged this session dead).
        """
        with self._write() as conn:
            if (
                conn.execute(
                    "SELECT 1 FROM records WHERE id = ? AND state = 0", (record_id,)
                ).fetchone()
                is None
            ):
                return None
            superseded = _rows(conn, "key = ? AND state = 1", (key,))
            self._remove(conn, superseded)
            conn.execute(
                "UPDATE records SET state = 1, access_ns = ? WHERE id = ?",
                (time.time_ns(), record_id),
            )
            seq = conn.execute("SELECT MAX(seq) FROM changes").fetchone()[0]
            if seq % 10_000 == 0:
                self._trim_changes(conn)
            return superseded, seq

    def abort(self, record_id: int) -> list[str]:
        """Drop a pending record whose write failed; its file name goes to trash.

        Returns the trashed path ([] if the row is gone); the caller unlinks the file (it may
        have been published already) and then calls ``trash_done``.
        """
        with self._write() as conn:
            rows = _rows(conn, "id = ? AND state = 0", (record_id,))
            self._remove(conn, rows)
            return [r.path for r in rows]

    def remove_key(self, key: bytes) -> list[Row]:
        """Remove the ready records of ``key``; their files go to trash. Returns them."""
        with self._write() as conn:
            rows = _rows(conn, "key = ? AND state = 1", (key,))
            self._remove(conn, rows)
            return rows

    def remove_records(self, record_ids: Collection[int], trash: bool = False) -> int:
        """Drop rows by id; rows removed.

        Their files are not trashed (they were quarantined or are missing) unless ``trash``:
        then they enter trash, for files that should be gone but could not be moved.
        """
        with self._write() as conn:
            if trash:
                rows = [r for i in record_ids for r in _rows(conn, "id = ?", (i,))]
                self._remove(conn, rows)
                return len(rows)
            return sum(
                conn.execute("DELETE FROM records WHERE id = ?", (i,)).rowcount for i in record_ids
            )

    def trash_done(self, paths: Collection[str]) -> None:
        """Forget trash entries whose files are unlinked."""
        if paths:
            with self._write() as conn:
                conn.executemany("DELETE FROM trash WHERE path = ?", [(p,) for p in paths])

    def touch(self, touches: Mapping[bytes, int]) -> None:
        """Record access times (key -> ns) for LRU."""
        if touches:
            with self._write() as conn:
                self._apply_touches(conn, touches)

    def reclaim(self, dead_sessions: Collection[str]) -> tuple[list[Row], list[str]]:
        """Take over what dead sessions left: drop their pending rows, adopt their trash.

        The files the dropped rows name (published before the writer died, or not) enter
        trash in the same transaction, so a crash before they are unlinked leaves them to
        the next reclaimer rather than as orphans outside the cap.

        Returns (dropped pending rows, trash paths now owned by this session, the dropped
        rows' files included); the caller removes the files and then calls ``trash_done``.
        """
        if not dead_sessions:
            return [], []
        marks = ",".join("?" * len(dead_sessions))
        sessions = list(dead_sessions)
        with self._write() as conn:
            pending = _rows(conn, f"state = 0 AND session IN ({marks})", sessions)
            paths = [
                p
                for (p,) in conn.execute(
                    f"SELECT path FROM trash WHERE session IN ({marks})", sessions
                )
            ]
            conn.execute(
                f"UPDATE trash SET session = ? WHERE session IN ({marks})",
                [self.session, *sessions],
            )
            self._remove(conn, pending)  # rows out, their files into this session's trash
            return pending, paths + [r.path for r in pending]

    def writer_sessions(self) -> set[str]:
        """Sessions that own pending rows or trash entries (candidates for ``reclaim``)."""
        with self._lock:
            return {
                s
                for (s,) in self._conn.execute(
                    "SELECT session FROM records WHERE state = 0 UNION SELECT session FROM trash"
                )
            }

    def set_used_bytes(self, used: int) -> None:
        """Repair the usage counter (``verify(fix=True)``)."""
        with self._write() as conn:
            conn.execute("UPDATE totals SET used_bytes = ?", (used,))

    def trim_changes(self) -> None:
        with self._write() as conn:
            self._trim_changes(conn)

    # -- helpers (inside a transaction) -----------------------------------------------------

    def _pick_lru(
        self, conn: sqlite3.Connection, want: int, pinned: Collection[bytes]
    ) -> list[Row]:
        picked: list[Row] = []
        freed = 0
        last_access, last_id = -1, -1
        while freed < want:
            batch = conn.execute(
                "SELECT id, key, state, record_bytes, session, access_ns FROM records "
                "WHERE state = 1 AND (access_ns, id) > (?, ?) ORDER BY access_ns, id LIMIT ?",
                (last_access, last_id, _EVICT_SCAN_BATCH),
            ).fetchall()
            if not batch:
                break
            for *fields, access_ns in batch:
                last_access, last_id = access_ns, fields[0]
                row = Row(*fields)
                if row.key in pinned:
                    continue
                picked.append(row)
                freed += row.record_bytes
                if freed >= want:
                    break
        return picked

    def _remove(self, conn: sqlite3.Connection, rows: list[Row]) -> None:
        conn.executemany("DELETE FROM records WHERE id = ?", [(r.record_id,) for r in rows])
        conn.executemany(
            "INSERT OR REPLACE INTO trash(path, session) VALUES (?, ?)",
            [(r.path, self.session) for r in rows],
        )

    @staticmethod
    def _apply_touches(conn: sqlite3.Connection, touches: Mapping[bytes, int]) -> None:
        conn.executemany(
            "UPDATE records SET access_ns = MAX(access_ns, ?) WHERE key = ? AND state = 1",
            [(t, k) for k, t in touches.items()],
        )

    @staticmethod
    def _trim_changes(conn: sqlite3.Connection) -> None:
        top = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
        floor = top - CHANGES_KEPT
        if floor > 0:
            conn.execute("DELETE FROM changes WHERE seq <= ?", (floor,))
            conn.execute("UPDATE meta SET value = ? WHERE name = 'changes_floor'", (floor,))


def _rows(conn: sqlite3.Connection, where: str, params: Sequence[object] = ()) -> list[Row]:
    """The ``records`` rows matching ``where`` (an SQL condition with ? placeholders)."""
    return [
        Row(*r)
        for r in conn.execute(
            f"SELECT id, key, state, record_bytes, session FROM records WHERE {where}", params
        )
    ]
