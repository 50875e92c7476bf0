"""The disk index's schema, version and row types (used by kvtier.store.disk.index and its
callers). See kvtier.store.disk.index for what each table holds and how charges move."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from kvtier.format.record import HEADER_BYTES
from kvtier.store.disk.layout import record_name, temp_name

SCHEMA_VERSION = 2
PENDING, READY = 0, 1
#: Change-log rows kept for processes that have not refreshed lately (a store that missed
#: more reloads its view). About 100 bytes of index each, charged against the cap.
CHANGES_KEPT = 10_000
#: Charges are rounded up to this (the allocation unit of ext4/xfs with 4 KiB blocks).
ALLOC_UNIT = 4096
#: WAL pages after which a commit checkpoints; the WAL file is truncated to this after one.
#: Each checkpoint syncs the WAL and the database (``synchronous=NORMAL``), a cache flush of
#: the whole device: at 24 pages a disk tier writing 400 MB/s flushed its device about 40 times
#: a second, where vLLM's ``fs`` tier flushes it never. 1,024 pages (4 MiB, about SQLite's own
#: default) makes that about one a second, for 4 MiB more of the cap.
WAL_AUTOCHECKPOINT_PAGES = 1024
WAL_SIZE_LIMIT_BYTES = WAL_AUTOCHECKPOINT_PAGES * 4096
#: Most rows one write transaction evicts, touches, forgets or trims: a transaction adds at
#: most about one WAL page per row it changes (random keys), so this bounds what one adds.
TXN_ROWS_MAX = 24
#: Most records one batched put reserves and commits in one transaction each (``DiskStore``
#: splits a longer ``put_many``). A reservation takes access times for at most
#: ``TXN_ROWS_MAX + 1`` less its records, so it changes no more rows than a single put's
#: did (TXN_ROWS_MAX evictions, TXN_ROWS_MAX touches, one insert); a commit changes at most
#: two rows per record (the record and a superseded one of its key).
PUT_BATCH_MAX = 16
#: What one transaction of at most TXN_ROWS_MAX rows adds to the WAL, at most (measured:
#: 64 evictions of random keys added 63 pages to the WAL of a 3,000-record index).
WAL_TXN_BYTES = 96 * 4096
#: SQL for ``charge`` of the expression substituted for {x}.
CHARGE_SQL = "((({x}) + 4095) / 4096) * 4096"

#: The tables, indexes and triggers (idempotent: IF NOT EXISTS / OR IGNORE).
SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ns TEXT NOT NULL,
    key BLOB NOT NULL,
    state INTEGER NOT NULL,
    record_bytes INTEGER NOT NULL,
    access_ns INTEGER NOT NULL,
    session TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_key ON records(ns, key);
CREATE INDEX IF NOT EXISTS records_lru ON records(state, access_ns);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 0), used_bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (0, 0);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL, key BLOB NOT NULL,
    record_id INTEGER NOT NULL, op INTEGER NOT NULL, record_bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS trash (
    path TEXT PRIMARY KEY, session TEXT NOT NULL, charge INTEGER NOT NULL, temp TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    path TEXT PRIMARY KEY, ns TEXT NOT NULL, charge INTEGER NOT NULL, added_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('schema_version', {SCHEMA_VERSION}), ('changes_floor', 0);
CREATE TRIGGER IF NOT EXISTS records_added AFTER INSERT ON records BEGIN
    UPDATE totals SET used_bytes = used_bytes + {CHARGE_SQL.format(x="NEW.record_bytes")}
        WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS records_removed AFTER DELETE ON records BEGIN
    UPDATE totals SET used_bytes = used_bytes - {CHARGE_SQL.format(x="OLD.record_bytes")}
        WHERE id = 0;
    INSERT INTO changes(ns, key, record_id, op, record_bytes)
        SELECT OLD.ns, OLD.key, OLD.id, 0, OLD.record_bytes WHERE OLD.state = 1;
END;
CREATE TRIGGER IF NOT EXISTS records_ready AFTER UPDATE OF state ON records
WHEN NEW.state = 1 AND OLD.state = 0 BEGIN
    INSERT INTO changes(ns, key, record_id, op, record_bytes)
        VALUES (NEW.ns, NEW.key, NEW.id, 1, NEW.record_bytes);
END;
CREATE TRIGGER IF NOT EXISTS trash_added AFTER INSERT ON trash BEGIN
    UPDATE totals SET used_bytes = used_bytes + NEW.charge WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS trash_removed AFTER DELETE ON trash BEGIN
    UPDATE totals SET used_bytes = used_bytes - OLD.charge WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS quarantine_added AFTER INSERT ON quarantine BEGIN
    UPDATE totals SET used_bytes = used_bytes + NEW.charge WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS quarantine_removed AFTER DELETE ON quarantine BEGIN
    UPDATE totals SET used_bytes = used_bytes - OLD.charge WHERE id = 0;
END;
"""


def charge(size: int) -> int:
    """What a file of ``size`` bytes costs against the cap (rounded up to ALLOC_UNIT)."""
    return -(-size // ALLOC_UNIT) * ALLOC_UNIT


class SchemaError(Exception):
    """The index was written by another schema version (``version`` says which)."""

    def __init__(self, version: int) -> None:
        super().__init__(f"index schema {version}, this kvtier reads {SCHEMA_VERSION}")
        self.version = version


def read_schema_version(conn: sqlite3.Connection) -> int | None:
    """The schema version stored in an index, or None for an empty database."""
    tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "meta" not in tables:
        return None
    row = conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
    return None if row is None else int(row[0])


@dataclass(frozen=True, slots=True)
class Row:
    """One row of ``records``."""

    #: Unique record id (part of the file name).
    record_id: int
    #: Namespace folder name (digest hex).
    ns: str
    #: The block key.
    key: bytes
    #: PENDING or READY.
    state: int
    #: Header + payload bytes (charged rounded up, see ``charge``).
    record_bytes: int
    #: Writer session id.
    session: str

    @property
    def name(self) -> str:
        """The record file, relative to its namespace folder."""
        return record_name(self.key, self.record_id)

    @property
    def path(self) -> str:
        """The record file, relative to the root."""
        return f"{self.ns}/{self.name}"

    @property
    def temp(self) -> str:
        """The file the writer writes before publishing, relative to the root."""
        return f"{self.ns}/{temp_name(self.key, self.record_id, self.session)}"

    @property
    def payload_len(self) -> int:
        return self.record_bytes - HEADER_BYTES


@dataclass(frozen=True, slots=True)
class Trashed:
    """A trash entry: files to unlink (relative to the root) before its charge is released."""

    #: The record file.
    path: str
    #: The writer's temp file for a write that never finished, or "".
    temp: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """The outcome of ``Index.reserve`` for a batch of records, position by position."""

    #: Per record: the id of its new pending record; None where it is not reserved: refused
    #: (``refused`` says why) or not yet (empty the trash and ask again).
    record_ids: list[int | None]
    #: Positions refused for good, and why ("larger than the cap", "no room: ...").
    refused: dict[int, str]
    #: Records evicted to make room (any namespace): they left the index; their files are in
    #: ``trash``, still charged.
    evicted: list[Row]


@dataclass(frozen=True, slots=True)
class Commit:
    """The outcome of ``Index.commit`` for a batch of pending records."""

    #: Per record: the change-log position that made it ready; None where its pending row was
    #: gone (reclaimed by another process that judged this session dead).
    seqs: list[int | None]
    #: Older ready records of the batch's keys, moved to trash (still charged).
    superseded: list[Row]


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
