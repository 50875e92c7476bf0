"""The disk store's shared index: one SQLite database per disk root, for all its namespaces.

Every process that opens any namespace under a root uses the same index, so the byte cap
(a promise about the whole folder), the LRU order and the set of records hold across
namespaces, processes and restarts. WAL mode with ``synchronous=NORMAL``: readers never wait
for the writer, and a commit costs no fsync (a power cut may lose the last commits; see the
crash story in kvtier.store.disk.store for why that is safe). The WAL is bounded
(``wal_autocheckpoint`` and ``journal_size_limit``) and the index files are charged against
the cap by the store (``DiskStore.footprint_bytes``; reservations charge them at
``kvtier.store.disk.root.index_charge``).

Tables::

    records(id, ns, key, state, record_bytes, access_ns, session)
        id       unique record id, never reused (AUTOINCREMENT), part of the file name
        ns       namespace folder name (digest hex)
        state    0 pending (bytes reserved, file being written), 1 ready (servable)
        session  writer session; a pending row of a dead session is reclaimed
    trash(path, session, charge, temp)
                             files whose rows are gone but which are not unlinked yet (path
                             and temp relative to the root); still charged
    quarantine(path, ns, charge, added_ns)
                             quarantined entries (relative to the root); charged until pruned
    totals(used_bytes)       charge of records + trash + quarantine, kept by triggers
    changes(seq, ns, key, record_id, op, record_bytes)
                             log of records becoming ready (op 1) or leaving (op 0), kept
                             by triggers; other processes follow it in refresh()
    meta(name, value)        schema_version, changes_floor (log trimmed below this seq),
                             capacity_bytes and low_watermark_ppm (the root's settings)

A record is charged its size rounded up to ``ALLOC_UNIT`` (what a 4 KiB-block file system
allocates), so the cap holds for ``du`` as well as for the sum of file sizes. Bytes leave
``totals`` only when their file is gone: an evicted or superseded record's charge moves to its
trash entry in the same transaction and is released by ``trash_done`` after the unlink.

Every write transaction is ``BEGIN IMMEDIATE`` (takes the write lock up front, so a check
and the write that depends on it cannot interleave with another process's).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvtier.format.record import HEADER_BYTES
from kvtier.store.disk.schema import (
    ALLOC_UNIT,
    CHANGES_KEPT,
    CHARGE_SQL,
    PENDING,
    PUT_BATCH_MAX,
    READY,
    SCHEMA_SQL,
    SCHEMA_VERSION,
    TXN_ROWS_MAX,
    WAL_AUTOCHECKPOINT_PAGES,
    WAL_SIZE_LIMIT_BYTES,
    WAL_TXN_BYTES,
    Change,
    Commit,
    Reservation,
    Row,
    SchemaError,
    Trashed,
    charge,
    read_schema_version,
)

__all__ = [
    "ALLOC_UNIT",
    "CHANGES_KEPT",
    "PENDING",
    "PUT_BATCH_MAX",
    "READY",
    "SCHEMA_VERSION",
    "TXN_ROWS_MAX",
    "WAL_SIZE_LIMIT_BYTES",
    "WAL_TXN_BYTES",
    "Change",
    "Commit",
    "Index",
    "Reservation",
    "Row",
    "SchemaError",
    "Trashed",
    "charge",
    "read_schema_version",
]

#: Whether a transaction's statements run as scripts (``_change``, ``_query_json``), one GIL
#: hand-over a statement. Only in CPython 3.12's ``autocommit=True`` does ``executescript`` not
#: commit an open transaction before its script; in the legacy mode (3.11's only one,
#: ``isolation_level=None`` too) it does, so there they run as before. ``commit()`` and
#: ``rollback()`` do nothing then: a transaction ends by a script too (``Index._end``).
_SCRIPTS = sys.version_info >= (3, 12)
_EVICT_SCAN_BATCH = 256
#: Rows of the LRU order a reservation reads with its figures, in the same statement, for the
#: eviction it may need (at most TXN_ROWS_MAX records, past the few pinned ones): a statement
#: of its own is a dozen GIL hand-overs (see _rows), the text unparsed when nothing is evicted.
_EVICT_FIRST_ROWS = TXN_ROWS_MAX + 8
#: Most rows one statement deletes or trashes (its parameters stay far below SQLite's limit).
_ROWS_PER_STATEMENT = 128
#: A row's readiness in a query that finds rows by namespace and key. The unary plus keeps
#: SQLite's planner off ``records_lru (state, access_ns)``: knowing nothing of the data, it
#: walked that index for ``state = 1``, every ready record of every namespace, rather than
#: ``records_key``, so a commit's lookup of its key, and each access time written, grew with
#: the folder's record count instead of staying microseconds
#: (``tests/store/test_store_index_plans.py`` reads every statement's plan).
_READY = "+state = 1"


class Index:
    """Thread-safe access to a root's index (one connection behind a lock), seen from one
    namespace ``ns`` (None: root-wide tools, which use no namespace-bound method).

    Rejected: a connection per thread. SQLite admits one writer at a time anyway, and the
    store's slow work (checksums, file I/O) happens outside the index; the lock is held only
    for short transactions (see the lock-hold figures in docs/store.md).
    """

    def __init__(
        self, path: Path, session: str, ns: str | None, busy_timeout_s: float = 30.0
    ) -> None:
        """Open (creating the tables if needed). Raises ``SchemaError`` for an index of
        another schema version, ``sqlite3.DatabaseError`` for a damaged one."""
        self.session = session
        self.ns = ns
        self._wal_path = f"{path}-wal"
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._local = threading.local()
        # No implicit transactions in either mode: each one's BEGIN is the index's own.
        mode: dict[str, object] = {"autocommit": True} if _SCRIPTS else {"isolation_level": None}
        self._conn = sqlite3.connect(path, timeout=busy_timeout_s, check_same_thread=False, **mode)
        try:
            self._conn.create_function(_RESULT_FUNCTION, 1, _keep_result, deterministic=False)
            self._set_wal_mode()
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
            self._conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            with self._lock:  # a script brings its own BEGIN (see _SCRIPTS)
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    version = read_schema_version(self._conn)
                finally:
                    self._conn.execute("COMMIT")
                if version is not None and version != SCHEMA_VERSION:
                    raise SchemaError(version)
                self._conn.executescript("BEGIN IMMEDIATE;" + SCHEMA_SQL + "COMMIT;")
            verdict = self._conn.execute("PRAGMA quick_check").fetchall()
            if verdict != [("ok",)]:
                raise sqlite3.DatabaseError(f"quick_check: {verdict[:3]}")
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _set_wal_mode(self) -> None:
        """``journal_mode=WAL``, retried: it can answer "locked" without waiting on the busy
        handler while another process recovers or truncates the WAL."""
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @contextmanager
    def bounded(self, wait_s: float) -> Iterator[None]:
        """Within the block, this thread's index calls wait at most about ``wait_s`` for the
        index (this process's other threads, another process's write lock, readers holding
        the WAL past its bound) and then raise ``sqlite3.OperationalError``.

        For the read path: a load must cost at most its deadline, and the busy timeout
        (30 s by default) is as long as the load deadline's ceiling. A reader in another
        process (``kvtier du``, a second engine) slowed by busy CPUs held a snapshot long
        enough that the WAL passed its bound, and a corrupt record's quarantine then waited
        for the whole busy timeout inside a load, with the index lock held.
        """
        self._local.wait_s = wait_s
        try:
            yield
        finally:
            self._local.wait_s = None

    @contextmanager
    def _locked(self) -> Iterator[float | None]:
        """The connection's lock, waited for as ``bounded`` says (None: unbounded)."""
        wait_s = getattr(self._local, "wait_s", None)
        if wait_s is None:
            with self._lock:
                yield None
            return
        if not self._lock.acquire(timeout=wait_s):
            raise sqlite3.OperationalError(f"index busy for {wait_s:.1f} s in this process")
        try:
            self._conn.execute(f"PRAGMA busy_timeout={int(wait_s * 1000)}")
            try:
                yield wait_s
            finally:
                self._conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        finally:
            self._lock.release()

    def _wal_bytes(self) -> int:
        try:
            return os.stat(self._wal_path).st_size
        except FileNotFoundError:
            return 0

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction under the lock; rolled back on any exception.

        The WAL is bounded here, holding the write lock: if it is past
        WAL_SIZE_LIMIT_BYTES (checkpoints starved by readers), a truncating checkpoint runs
        first (waiting for readers up to the busy timeout) and the transaction starts again;
        if the WAL stays past its limit, the write is refused (``sqlite3.OperationalError``)
        rather than let the WAL outgrow its charge.
        """
        with self._locked() as wait_s:
            deadline = time.monotonic() + (wait_s or self._busy_timeout_s)
            pause = 0.001
            while True:
                self._begin("BEGIN IMMEDIATE")
                if self._wal_bytes() <= WAL_SIZE_LIMIT_BYTES:
                    break
                # Busy (another checkpoint, readers), or another writer appended between this
                # checkpoint and the next BEGIN: try again until the busy timeout.
                self._end("ROLLBACK")
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                if self._wal_bytes() <= WAL_SIZE_LIMIT_BYTES:
                    continue
                if time.monotonic() > deadline:
                    raise sqlite3.OperationalError("index WAL past its bound; readers hold it")
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            try:
                yield self._conn
                self._end("COMMIT")
            except BaseException:
                self._end("ROLLBACK")  # a failed COMMIT may leave it open
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot under the lock."""
        with self._locked():
            self._begin("BEGIN")
            try:
                yield self._conn
            finally:
                self._end("COMMIT")

    def _begin(self, statement: str) -> None:
        """Start a transaction, giving the GIL up once.

        Through ``executescript``, which runs a statement in one GIL-free call, and ended by
        ``_end``, one call too: ``execute`` gives the GIL up five or six times a statement
        (reset, parameter count, step, column count, reset, last row id, in CPython
        3.11-3.13's sqlite3), and the writing thread waits for it at each return while an
        engine thread runs Python (docs/store.md, "What a put costs the engine"), so
        ``execute("BEGIN IMMEDIATE")`` and ``execute("COMMIT")`` cost a transaction ten or
        twelve hand-overs where these cost two. Before 3.12, ``executescript`` commits a
        transaction left open first; none may be here (``_write`` rolls back what it leaves
        open), and one that is is rolled back, never committed: its caller was told it failed.
        """
        self._end("ROLLBACK")
        self._conn.executescript(statement)

    def _end(self, statement: str) -> None:
        """End the open transaction, if any, by ``statement`` (COMMIT or ROLLBACK), giving the
        GIL up once: as a script where ``commit()`` and ``rollback()`` do nothing
        (``_SCRIPTS``)."""
        if not self._conn.in_transaction:
            return
        if _SCRIPTS:
            self._conn.executescript(statement)
        elif statement == "COMMIT":
            self._conn.commit()
        else:
            self._conn.rollback()

    # -- settings ----------------------------------------------------------------------------

    def settings(self) -> tuple[int | None, int | None]:
        """(capacity_bytes, low_watermark_ppm) stored for the root; None where unset."""
        with self._read() as conn:
            found = dict(conn.execute("SELECT name, value FROM meta"))
        return found.get("capacity_bytes"), found.get("low_watermark_ppm")

    def set_settings(
        self, capacity_bytes: int | None, low_watermark_ppm: int | None
    ) -> tuple[int | None, int | None]:
        """Store the values that are not None; return the previous (capacity, low ppm)."""
        with self._write() as conn:
            found = dict(conn.execute("SELECT name, value FROM meta"))
            for name, value in (
                ("capacity_bytes", capacity_bytes),
                ("low_watermark_ppm", low_watermark_ppm),
            ):
                if value is not None:
                    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))
        return found.get("capacity_bytes"), found.get("low_watermark_ppm")

    # -- queries ---------------------------------------------------------------------------

    def used_bytes(self) -> int:
        """Charge of records, trash and quarantine (the index files are not included)."""
        with self._locked():
            return self._conn.execute("SELECT used_bytes FROM totals").fetchone()[0]

    def load_ready(self) -> tuple[list[tuple[bytes, int, int]], int]:
        """(key, record id, payload length) of every ready record of ``ns``, and the change-log
        position they reflect. Plain tuples: this runs over every record at start-up."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT key, id, record_bytes - ? FROM records WHERE ns = ? AND {_READY}",
                (HEADER_BYTES, self.ns),
            ).fetchall()
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
        return rows, seq

    def changes_since(self, seq: int) -> tuple[list[Change], int] | None:
        """Changes of ``ns`` after ``seq`` in order, and the log position they reflect; None
        if the log was trimmed past ``seq`` (reload)."""
        with self._read() as conn:
            floor = conn.execute("SELECT value FROM meta WHERE name='changes_floor'").fetchone()[0]
            if seq < floor:
                return None
            top = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
            changes = [
                Change(s, k, r, bool(op), size - HEADER_BYTES)
                for s, k, r, op, size in conn.execute(
                    "SELECT seq, key, record_id, op, record_bytes FROM changes "
                    "WHERE seq > ? AND ns = ? ORDER BY seq",
                    (seq, self.ns),
                )
            ]
        return changes, max(seq, top)

    def is_ready(self, record_id: int) -> bool:
        """True if record ``record_id`` is still in the index and ready (one indexed query)."""
        with self._locked():
            return (
                self._conn.execute(
                    "SELECT 1 FROM records WHERE id = ? AND state = 1", (record_id,)
                ).fetchone()
                is not None
            )

    def all_rows(self) -> list[Row]:
        """Every row of ``ns`` (of every namespace if ``ns`` is None)."""
        where, params = ("1", ()) if self.ns is None else ("ns = ?", (self.ns,))
        with self._locked():
            return [
                Row(*r)
                for r in self._conn.execute(
                    f"SELECT id, ns, key, state, record_bytes, session FROM records WHERE {where}",
                    params,
                )
            ]

    def trash(self) -> list[tuple[Trashed, str]]:
        """(entry, session) of every trash entry of the root."""
        with self._locked():
            return [
                (Trashed(p, t), s)
                for p, t, s in self._conn.execute("SELECT path, temp, session FROM trash")
            ]

    def quarantined(self) -> list[tuple[str, int, int]]:
        """(path, charge, added ns) of every quarantine entry of the root, oldest first."""
        with self._locked():
            return list(
                self._conn.execute(
                    "SELECT path, charge, added_ns FROM quarantine ORDER BY added_ns"
                )
            )

    def counter_drift(self) -> tuple[int, int]:
        """(totals.used_bytes, actual charge of records + trash + quarantine)."""
        with self._read() as conn:
            used = conn.execute("SELECT used_bytes FROM totals").fetchone()[0]
            actual = conn.execute(
                f"SELECT (SELECT COALESCE(SUM({CHARGE_SQL.format(x='record_bytes')}), 0) "
                "FROM records) + (SELECT COALESCE(SUM(charge), 0) FROM trash) "
                "+ (SELECT COALESCE(SUM(charge), 0) FROM quarantine)"
            )
            return used, actual.fetchone()[0]

    # -- writes ----------------------------------------------------------------------------

    def reserve(
        self,
        records: Sequence[tuple[bytes, int]],
        measure: Callable[[], tuple[int, int | None]],
        pinned: Collection[bytes],
        touches: Mapping[bytes, int],
    ) -> Reservation:
        """Reserve room for new pending records, (key, record bytes) each, in one
        transaction, evicting if needed; the keys must be distinct.

        ``measure()``, called once holding the write lock, gives what the index files cost
        (the overhead) and the free space above the free-space floor before the batch is
        written (None: no floor). The cap and low watermark are the root's stored settings,
        read in the transaction. A record fits if usage (records, trash, quarantine) plus
        the overhead plus the records reserved before it stays within the cap. If the batch
        would not fit once the trash is emptied, ready records of any namespace are evicted
        in LRU order (skipping ``pinned`` keys) until that usage is at most the low
        watermark (a share of what the overhead leaves of the cap), and more to keep the
        free-space floor. At most TXN_ROWS_MAX records
        are evicted and touches applied per call. Evicted records move to trash, still
        charged, so a record that needed them is not reserved yet (its id is None, it is not
        refused): the caller empties the trash and asks again for it.

        A record is refused, changing nothing for it, when it is larger than the cap and
        the index files together, or when it would not fit even after every eviction this
        call could make, which found no more to evict; when every record is refused nothing
        is evicted either. ``touches`` (key -> access time of a record of
        ``ns``) are applied first so the LRU order is current.
        """
        now = time.time_ns()
        costs = [charge(record_bytes) for _, record_bytes in records]
        refused: dict[int, str] = {}
        with self._write() as conn:
            self._apply_touches(conn, touches)
            overhead_bytes, room_above_floor = measure()
            # One column (see _rows): a row gives the GIL up once more a column it has. The
            # LRU order's first rows come as text ('' || drops the JSON subtype), parsed only
            # for an eviction. The last id: AUTOINCREMENT's, what its next row is numbered
            # after (the larger of the table's sequence and its largest id).
            capacity, ppm, used, trash, lru_rows, last_id = _query_json(
                conn,
                "json_array((SELECT value FROM meta WHERE name = 'capacity_bytes'), "
                "(SELECT value FROM meta WHERE name = 'low_watermark_ppm'), "
                "(SELECT used_bytes FROM totals), (SELECT COALESCE(SUM(charge), 0) FROM trash), "
                f"'' || ({_LRU_ROWS}), "
                "MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'records'), 0), "
                "COALESCE((SELECT MAX(id) FROM records), 0)))",
                params=(-1, -1, _EVICT_FIRST_ROWS),
            )
            if capacity is None:
                raise KeyError("capacity_bytes")  # a root's settings are written at creation
            # The watermark is a share of the room the index files leave for the rest.
            ppm = 900_000 if ppm is None else ppm
            low = overhead_bytes + max(0, capacity - overhead_bytes) * ppm // 1_000_000
            settled = used - trash + overhead_bytes  # once the trash is emptied

            def floor_need(written_bytes: int) -> int:
                if room_above_floor is None:
                    return 0
                return max(0, written_bytes - room_above_floor)

            wanted = []
            for i, cost in enumerate(costs):
                if cost + overhead_bytes > capacity:
                    refused[i] = "larger than the cap"
                else:
                    wanted.append(i)
            total = sum(costs[i] for i in wanted)
            extra = floor_need(sum(records[i][1] for i in wanted))
            evicted: list[Row] = []
            freed = 0
            if wanted and max(settled + total - capacity, extra) > 0:
                want = max(settled + total - low, extra)
                evicted = self._pick_lru(conn, want, pinned, lru_rows)
                freed = sum(charge(r.record_bytes) for r in evicted)
            # Fewer than a call's most: the LRU scan freed what it wanted or found nothing
            # more to evict (a record that still does not fit never will).
            exhausted = len(evicted) < TXN_ROWS_MAX
            record_ids: list[int | None] = [None] * len(records)
            room = _Room(capacity, used + overhead_bytes, settled - freed, freed, exhausted)
            inserts = room.admit(
                [(i, costs[i], records[i][1]) for i in wanted], floor_need, refused
            )
            if len(refused) == len(records):
                # Nothing to reserve: evict nothing either (the touches still count).
                return Reservation([None] * len(records), refused, [])
            self._remove(conn, evicted)
            if inserts:
                # One statement, numbered as AUTOINCREMENT would (this transaction has held
                # the write lock since the query read the last id), but by this code: the
                # ids need no read of the last row id, a GIL hand-over (see _change), and
                # one already taken fails the insert (the primary key) rather than a
                # record being filed under another's id.
                for offset, i in enumerate(inserts):
                    record_ids[i] = last_id + 1 + offset
                _change(
                    conn,
                    (
                        "INSERT INTO records(id, ns, key, state, record_bytes, access_ns, "
                        f"session) VALUES {','.join(['(?, ?, ?, 0, ?, ?, ?)'] * len(inserts))}",
                        [
                            v
                            for i in inserts
                            for v in (
                                record_ids[i],
                                self.ns,
                                records[i][0],
                                records[i][1],
                                now,
                                self.session,
                            )
                        ],
                    ),
                )
            return Reservation(record_ids, refused, evicted)

    def commit(self, records: Sequence[tuple[int, bytes]]) -> Commit:
        """Make pending records, (record id, key) each with distinct keys, ready in one
        transaction; older ready records of their keys go to trash. A record whose pending
        row is gone (reclaimed by another process that judged this session dead) stays out."""
        with self._write() as conn:
            ids = [record_id for record_id, _ in records]
            marks = ",".join("?" * len(ids))
            # Ready first: the readiness trigger logs each record still pending, as the log's
            # last rows (AUTOINCREMENT numbers after every row there is; this transaction holds
            # the write lock). Then one statement finds, in one result row (see _rows): each
            # readied record's log position, the other ready records of their keys (which
            # they supersede: they leave after, logged after) and the log's first position.
            _change(
                conn,
                (
                    f"UPDATE records SET state = 1, access_ns = ? "
                    f"WHERE id IN ({marks}) AND +state = 0",
                    [time.time_ns(), *ids],
                ),
            )
            logged, older, first = _query_json(
                conn,
                "json_array("
                "(SELECT json_group_array(json_array(record_id, seq)) FROM changes "
                "WHERE seq > (SELECT MAX(seq) FROM changes) - ? AND op = 1 "
                f"AND record_id IN ({marks})), "
                f"(SELECT json_group_array(json_array({_ROW_COLUMNS})) FROM records "
                f"WHERE ns = ? AND {_READY} AND id NOT IN ({marks}) AND key IN "
                f"(SELECT key FROM records WHERE id IN ({marks}))), "
                "(SELECT COALESCE(MIN(seq), 0) FROM changes))",
                params=[len(ids), *ids, self.ns, *ids, *ids],
            )
            seq_of = {record_id: seq for record_id, seq in logged}
            superseded = [_row(fields) for fields in older]
            self._remove(conn, superseded)
            if seq_of:
                top = max(seq_of.values())
                if top // 64 > (min(seq_of.values()) - 1) // 64:
                    self._trim_changes(conn, top, first)
            return Commit([seq_of.get(record_id) for record_id in ids], superseded)

    def abort(self, record_id: int) -> list[Trashed]:
        """Drop a pending record whose write failed; its files go to trash.

        Returns the trash entry ([] if the row is gone); the caller unlinks the files (the
        record may have been published already) and then calls ``trash_done``.
        """
        with self._write() as conn:
            rows = _rows(conn, "id = ? AND state = 0", (record_id,))
            return self._remove(conn, rows)

    def remove_key(self, key: bytes) -> list[Row]:
        """Remove the ready records of ``key``; their files go to trash. Returns them."""
        with self._write() as conn:
            rows = _rows(conn, f"ns = ? AND key = ? AND {_READY}", (self.ns, key))
            self._remove(conn, rows)
            return rows

    def remove_records(self, record_ids: Collection[int], trash: bool = False) -> int:
        """Drop rows by id; rows removed.

        Their files are not trashed (they are missing) unless ``trash``: then they enter
        trash, for files that should be gone but could not be moved.
        """
        with self._write() as conn:
            if trash:
                rows = [r for i in record_ids for r in _rows(conn, "id = ?", (i,))]
                self._remove(conn, rows)
                return len(rows)
            return sum(
                conn.execute("DELETE FROM records WHERE id = ?", (i,)).rowcount for i in record_ids
            )

    def quarantine_record(self, record_id: int | None, path: str, cost: int) -> None:
        """Charge a quarantine entry (``path`` relative to the root) of ``cost`` bytes and, in
        the same transaction, drop the row of the record it was (if any)."""
        with self._write() as conn:
            if record_id is not None:
                conn.execute("DELETE FROM records WHERE id = ?", (record_id,))
            conn.execute(
                "INSERT OR REPLACE INTO quarantine VALUES (?, ?, ?, ?)",
                (path, path.split("/", 1)[0], cost, time.time_ns()),
            )

    def quarantine_done(self, paths: Collection[str]) -> None:
        """Forget quarantine entries whose files are removed."""
        self._forget_paths("quarantine", paths)

    def trash_done(self, paths: Collection[str]) -> None:
        """Forget trash entries whose files are unlinked, releasing their charge."""
        self._forget_paths("trash", paths)

    def _forget_paths(self, table: str, paths: Collection[str]) -> None:
        """Delete ``table``'s entries for ``paths``: one statement for at most TXN_ROWS_MAX of
        them per transaction."""
        paths = list(paths)
        for start in range(0, len(paths), TXN_ROWS_MAX):
            part = paths[start : start + TXN_ROWS_MAX]
            with self._write() as conn:
                _change(
                    conn, (f"DELETE FROM {table} WHERE path IN ({','.join('?' * len(part))})", part)
                )

    def touch(self, touches: Mapping[bytes, int]) -> None:
        """Record access times (key of ``ns`` -> ns) for LRU."""
        items = list(touches.items())
        for start in range(0, len(items), TXN_ROWS_MAX):
            with self._write() as conn:
                self._apply_touches(conn, dict(items[start : start + TXN_ROWS_MAX]))

    def reclaim(self, dead_sessions: Collection[str]) -> tuple[list[Row], list[Trashed]]:
        """Take over what dead sessions left: drop their pending rows, adopt their trash.

        The files the dropped rows name (published before the writer died, or not) enter
        trash in the same transaction, still charged, so a crash before they are unlinked
        leaves them to the next reclaimer rather than as orphans outside the cap.

        Returns (dropped pending rows, trash entries now owned by this session, the dropped
        rows' included); the caller removes the files and then calls ``trash_done``.
        """
        if not dead_sessions:
            return [], []
        marks = ",".join("?" * len(dead_sessions))
        sessions = list(dead_sessions)
        with self._write() as conn:
            pending = _rows(conn, f"state = 0 AND session IN ({marks})", sessions)
            entries = [
                Trashed(p, t)
                for p, t in conn.execute(
                    f"SELECT path, temp FROM trash WHERE session IN ({marks})", sessions
                )
            ]
            conn.execute(
                f"UPDATE trash SET session = ? WHERE session IN ({marks})",
                [self.session, *sessions],
            )
            entries += self._remove(conn, pending)
            return pending, entries

    def writer_sessions(self) -> set[str]:
        """Sessions that own pending rows or trash entries (candidates for ``reclaim``)."""
        with self._locked():
            return {
                s
                for (s,) in self._conn.execute(
                    "SELECT session FROM records WHERE state = 0 UNION SELECT session FROM trash"
                )
            }

    def evict(
        self,
        ns: str | None = None,
        accessed_before_ns: int | None = None,
        target_bytes: int | None = None,
        overhead_bytes: int = 0,
    ) -> list[Row]:
        """Evict ready records (of namespace ``ns``, last used before ``accessed_before_ns``,
        where given) in LRU order; with ``target_bytes``, only until usage plus
        ``overhead_bytes`` would be at most that once the trash is emptied. At most
        TXN_ROWS_MAX rows per call: call again until it returns []. Their files go to trash,
        still charged; returns the rows (the caller unlinks, then ``trash_done``)."""
        where, params = ["state = 1"], []
        if ns is not None:
            where.append("ns = ?")
            params.append(ns)
        if accessed_before_ns is not None:
            where.append("access_ns < ?")
            params.append(accessed_before_ns)
        with self._write() as conn:
            candidates = [
                Row(*fields)
                for *fields, _ in conn.execute(
                    "SELECT id, ns, key, state, record_bytes, session, access_ns FROM records "
                    f"WHERE {' AND '.join(where)} ORDER BY access_ns, id",
                    params,
                )
            ]
            if target_bytes is not None:
                used = conn.execute("SELECT used_bytes FROM totals").fetchone()[0]
                trash = conn.execute("SELECT COALESCE(SUM(charge), 0) FROM trash").fetchone()[0]
                excess = used - trash + overhead_bytes - target_bytes
                picked: list[Row] = []
                for row in candidates:
                    if excess <= 0:
                        break
                    picked.append(row)
                    excess -= charge(row.record_bytes)
                candidates = picked
            candidates = candidates[:TXN_ROWS_MAX]
            self._remove(conn, candidates)
            return candidates

    def forget_namespace(self, ns: str) -> int:
        """Drop every row, trash and quarantine entry of namespace ``ns`` (its folder was
        removed); return the charge released."""
        with self._write() as conn:
            before = conn.execute("SELECT used_bytes FROM totals").fetchone()[0]
            conn.execute("DELETE FROM records WHERE ns = ?", (ns,))
            conn.execute("DELETE FROM trash WHERE path LIKE ? || '/%'", (ns,))
            conn.execute("DELETE FROM quarantine WHERE ns = ?", (ns,))
            return before - conn.execute("SELECT used_bytes FROM totals").fetchone()[0]

    def set_used_bytes(self, used: int) -> None:
        """Repair the usage counter (``verify(fix=True)``)."""
        with self._write() as conn:
            conn.execute("UPDATE totals SET used_bytes = ?", (used,))

    def truncate_wal(self, timeout_s: float = 1.0) -> bool:
        """Checkpoint the WAL into the database and truncate it to 0 bytes; True if done.

        Other writers wait while it waits for readers, so it waits ``timeout_s`` at most
        (not the busy timeout) and then gives up, leaving the WAL as it is.
        """
        with self._lock:
            self._conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
            try:
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                self._conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        return busy == 0

    def trim_changes(self) -> None:
        with self._write() as conn:
            top, bottom = conn.execute(
                "SELECT COALESCE(MAX(seq), 0), COALESCE(MIN(seq), 0) FROM changes"
            ).fetchone()
            self._trim_changes(conn, top, bottom)

    # -- helpers (inside a transaction) -----------------------------------------------------

    def _pick_lru(
        self, conn: sqlite3.Connection, want: int, pinned: Collection[bytes], first_rows: str
    ) -> list[Row]:
        """Ready records to evict, in LRU order, skipping ``pinned`` keys of ``ns``, until
        they free ``want`` bytes (at most TXN_ROWS_MAX); ``first_rows``: the order's first
        _EVICT_FIRST_ROWS rows (``_LRU_ROWS``), read by the reservation."""
        picked: list[Row] = []
        freed = 0
        last_access, last_id = -1, -1
        found: list | None = json.loads(first_rows)
        limit = _EVICT_FIRST_ROWS
        while freed < want and len(picked) < TXN_ROWS_MAX:
            if found is None:
                # One result row for the scan's batch (see _rows).
                found = _query_json(
                    conn, f"({_LRU_ROWS})", params=(last_access, last_id, _EVICT_SCAN_BATCH)
                )
                limit = _EVICT_SCAN_BATCH
            # Sorted here, since an aggregate's order is not promised.
            batch = sorted(found, key=lambda fields: (fields[-1], fields[0]))
            found = None
            for *fields, access_ns in batch:
                last_access, last_id = access_ns, fields[0]
                row = _row(fields)
                if row.ns == self.ns and row.key in pinned:
                    continue
                picked.append(row)
                freed += charge(row.record_bytes)
                if freed >= want or len(picked) >= TXN_ROWS_MAX:
                    break
            if len(batch) < limit:
                break  # the scan reached the end of the order
        return picked

    def _remove(self, conn: sqlite3.Connection, rows: list[Row]) -> list[Trashed]:
        """Rows out of ``records``, their files into trash with their charge (so the charge
        never leaves the cap before the files leave the disk)."""
        entries = [Trashed(r.path, r.temp if r.state == PENDING else "") for r in rows]
        # Two statements a slice, not two a row (see _rows).
        for start in range(0, len(rows), _ROWS_PER_STATEMENT):
            part = rows[start : start + _ROWS_PER_STATEMENT]
            _change(
                conn,
                (
                    f"DELETE FROM records WHERE id IN ({','.join('?' * len(part))})",
                    [r.record_id for r in part],
                ),
                (
                    "INSERT OR IGNORE INTO trash(path, session, charge, temp) "
                    f"VALUES {','.join(['(?, ?, ?, ?)'] * len(part))}",
                    [
                        v
                        for e, r in zip(entries[start : start + len(part)], part, strict=True)
                        for v in (e.path, self.session, charge(r.record_bytes), e.temp)
                    ],
                ),
            )
        return entries

    def _apply_touches(self, conn: sqlite3.Connection, touches: Mapping[bytes, int]) -> None:
        # One statement for the batch: SQLite gives the GIL up at every step, and a thread
        # waits for it at each return while an engine thread runs Python (access_times.py).
        if not touches:
            return
        rows = ",".join(["(?, ?)"] * len(touches))
        _change(
            conn,
            (
                f"WITH touched(key, access_ns) AS (VALUES {rows}) "
                "UPDATE records SET access_ns = MAX(records.access_ns, "
                "(SELECT touched.access_ns FROM touched WHERE touched.key = records.key)) "
                f"WHERE records.ns = ? AND {_READY} "
                "AND records.key IN (SELECT touched.key FROM touched)",
                [*(v for k, t in touches.items() for v in (k, t)), self.ns],
            ),
        )

    @staticmethod
    def _trim_changes(conn: sqlite3.Connection, top: int, bottom: int) -> None:
        """Trim the log below ``top - CHANGES_KEPT`` (``top``, ``bottom``: its last and first
        positions now)."""
        # A few hundred sequential rows at a time keep the transaction's WAL pages few.
        floor = min(top - CHANGES_KEPT, bottom + 256)
        if floor > 0 and top - CHANGES_KEPT > 0:
            _change(
                conn,
                ("DELETE FROM changes WHERE seq <= ?", (floor,)),
                ("UPDATE meta SET value = ? WHERE name = 'changes_floor'", (floor,)),
            )


class _Room:
    """Which records of a batch a reservation takes now, defers or refuses (``reserve``)."""

    def __init__(
        self, capacity: int, charged: int, settled: int, freed: int, exhausted: bool
    ) -> None:
        #: The cap; what is charged now (trash and overhead included); what will be once the
        #: trash, this call's evictions included, is emptied; what this call evicted; whether
        #: the eviction scan found nothing more to evict.
        self.capacity, self.charged, self.settled = capacity, charged, settled
        self.freed, self.exhausted = freed, exhausted

    def admit(
        self,
        records: list[tuple[int, int, int]],
        floor_need: Callable[[int], int],
        refused: dict[int, str],
    ) -> list[int]:
        """Positions of ``records`` (position, charge, bytes) that fit now, in order. One
        that cannot fit even once the trash is emptied, with nothing more to evict, goes into
        ``refused``; the others wait for the trash (counted for the records after them)."""
        now_cost = later_cost = later_bytes = 0
        taken = []
        for i, cost, record_bytes in records:
            need = floor_need(later_bytes + record_bytes)  # to evict for the floor
            if self.exhausted and (
                self.settled + later_cost + cost > self.capacity or self.freed < need
            ):
                refused[i] = "no room: nothing left to evict"
                continue
            later_cost += cost
            later_bytes += record_bytes
            if self.charged + now_cost + cost <= self.capacity and self.freed >= need:
                now_cost += cost
                taken.append(i)
        return taken


def _change(conn: sqlite3.Connection, *statements: tuple[str, Sequence[object]]) -> None:
    """Run ``statements`` (SQL with ? placeholders, parameters), which change rows and return
    none, in order: as one script, their parameters inlined as literals (``_SCRIPTS``), one
    GIL hand-over a statement; else each as ``executemany`` of one parameter set, four
    (``execute`` reads the last inserted row id too, one more). CPython's sqlite3 gives the
    GIL up at each, and the thread waits for it at each return while an engine thread runs
    Python (docs/store.md, "What a put costs the engine")."""
    if _SCRIPTS:
        conn.executescript(";".join(_inline(sql, params) for sql, params in statements))
        return
    for sql, params in statements:
        conn.executemany(sql, [params])


def _query_json(
    conn: sqlite3.Connection, column: str, rest: str = "", params: Sequence[object] = ()
) -> Any:
    """The value of ``SELECT column rest`` (one result row whose one column is JSON), parsed.

    With ``_SCRIPTS``, as a script whose statement hands the column to ``_keep_result``:
    the statement gives the GIL up once and the call takes it once, two hand-overs where
    ``execute`` and ``fetchone`` cost nine (docs/store.md, "What a put costs the engine").
    A call that raises makes its statement fail (``sqlite3.OperationalError``, "user-defined
    function raised exception"; the traceback is printed only under
    ``sqlite3.enable_callback_tracebacks``, a process-wide switch left alone), and ``_write``
    rolls the transaction back: it never passes unseen."""
    if not _SCRIPTS:
        (found,) = conn.execute(f"SELECT {column} {rest}", params).fetchone()
        return json.loads(found)
    _result.value = _NO_RESULT
    conn.executescript(_inline(f"SELECT {_RESULT_FUNCTION}({column}) {rest}", params))
    found, _result.value = _result.value, _NO_RESULT
    if found is _NO_RESULT:
        raise sqlite3.OperationalError(f"no result row: SELECT {column} {rest}")
    return json.loads(found)


#: The SQL function (registered on the index's connection) that keeps a script's result
#: (``_query_json``), in a slot of the calling thread: SQLite calls it on that thread.
_RESULT_FUNCTION = "kvtier_result"
_result = threading.local()
_NO_RESULT = object()


def _keep_result(value: object) -> None:
    _result.value = value


def _inline(sql: str, params: Sequence[object]) -> str:
    """``sql`` with each ? replaced by its parameter as an SQL literal: a Python int as
    digits, bytes as a blob literal, text as the blob of its UTF-8 cast to text (the same
    value a bound string is, and no quoting to get wrong: nothing of it reaches the SQL
    but hex digits), None as NULL. Any other type is refused."""
    parts = sql.split("?")
    if len(parts) != len(params) + 1:
        raise ValueError(f"{len(params)} parameters for {len(parts) - 1} placeholders: {sql}")
    inlined = [parts[0]]
    for value, part in zip(params, parts[1:], strict=True):
        inlined += (_literal(value), part)
    return "".join(inlined)


def _literal(value: object) -> str:
    if type(value) is int:  # not bool, nor an int subclass with its own str()
        if not -(1 << 63) <= value < 1 << 63:
            raise OverflowError(f"{value} is past SQLite's 64-bit integers")
        return str(value)
    if type(value) is bytes:
        return f"X'{value.hex()}'"
    if type(value) is str:
        return f"CAST(X'{value.encode().hex()}' AS TEXT)"
    if value is None:
        return "NULL"
    raise TypeError(f"no SQL literal for {type(value).__name__} {value!r}")


def _rows(conn: sqlite3.Connection, where: str, params: Sequence[object] = ()) -> list[Row]:
    """The ``records`` rows matching ``where`` (an SQL condition with ? placeholders), in
    one result row of one column: CPython's sqlite3 gives the GIL up at every step (one a
    result row) and once a column of each row fetched, and the thread waits for it at each
    return while an engine thread runs Python (docs/store.md, "What a put costs the
    engine"). For the few rows a serving path finds (a put's superseded records, a dead
    writer's pending ones), never a whole index (``all_rows``)."""
    found = _query_json(
        conn, f"json_group_array(json_array({_ROW_COLUMNS}))", f"FROM records WHERE {where}", params
    )
    return [_row(fields) for fields in found]


#: A row's columns as JSON (the key as hex: JSON has no bytes) and back (``_row``).
_ROW_COLUMNS = "id, ns, hex(key), state, record_bytes, session"
#: Ready records in LRU order after (access time, id) ``(?, ?)``, at most ``?`` of them, as one
#: JSON array of their columns and access times (one result row, see _rows).
_LRU_ROWS = (
    f"SELECT json_group_array(json_array({_ROW_COLUMNS}, access_ns)) FROM "
    "(SELECT * FROM records WHERE state = 1 AND (access_ns, id) > (?, ?) "
    "ORDER BY access_ns, id LIMIT ?)"
)


def _row(fields: list) -> Row:
    record_id, ns, key_hex, state, record_bytes, session = fields
    return Row(record_id, ns, bytes.fromhex(key_hex), state, record_bytes, session)
