"""Read-only views of a disk root for operators (``kvtier ls``/``du``): no session, no writes.

Reads the root's index through a read-only SQLite connection (which needs the ``-wal`` and
``-shm`` files of a live folder to exist, as they do while any store has it open) and each
namespace's ``namespace.json``. Safe while engines serve: it takes no lock a writer waits on
beyond SQLite's shared read.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import ConfigError, KvtierError
from kvtier.format.namespace import Namespace
from kvtier.format.record import HEADER_BYTES
from kvtier.store.disk import layout
from kvtier.store.disk.folders import folders_bytes
from kvtier.store.disk.index import ALLOC_UNIT, SCHEMA_VERSION, read_schema_version
from kvtier.store.disk.root import index_files_bytes, namespace_folders

_CHARGE = f"((record_bytes + {ALLOC_UNIT - 1}) / {ALLOC_UNIT}) * {ALLOC_UNIT}"


class UnreadableRoot(KvtierError):
    """The folder is missing, not a kvtier disk folder, or cannot be read."""


@dataclass(frozen=True)
class NamespaceSummary:
    """One namespace folder under a root, as the index and namespace.json describe it."""

    digest_hex: str
    #: None if namespace.json is missing or unreadable.
    namespace: Namespace | None
    blocks: int
    #: Charge of its ready records (sizes rounded up to 4 KiB).
    bytes: int
    #: Last use (ns since the epoch) of its least and most recently used record; 0 if none.
    oldest_use_ns: int
    newest_use_ns: int
    quarantine_bytes: int


@dataclass(frozen=True)
class BlockSummary:
    key: bytes
    record_id: int
    payload_bytes: int
    last_use_ns: int


@dataclass(frozen=True)
class RootUsage:
    """What the root's cap covers, and the file system around it."""

    capacity_bytes: int | None
    low_watermark: float | None
    #: Records, trash and quarantine (``DiskStore.used_bytes``).
    used_bytes: int
    #: used_bytes plus what the index and namespace.json files take
    #: (``DiskStore.footprint_bytes``).
    footprint_bytes: int
    trash_bytes: int
    quarantine_bytes: int
    quarantine_entries: int
    fs_free_bytes: int
    fs_total_bytes: int
    #: The default free-space floor a store keeps on this file system.
    floor_bytes: int


@contextlib.contextmanager
def read_index(root: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the root's index. Raises ``UnreadableRoot`` if there is
    none or it cannot be read, ``ConfigError`` for an index of another schema."""
    path = Path(root) / layout.INDEX_FILE
    if not Path(root).is_dir():
        raise UnreadableRoot(f"{root} is not a folder")
    if not path.is_file():
        raise UnreadableRoot(f"{root} holds no kvtier index ({layout.INDEX_FILE})")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
        version = read_schema_version(conn)
    except sqlite3.Error as exc:
        raise UnreadableRoot(f"cannot read {path}: {exc}") from None
    try:
        if version != SCHEMA_VERSION:
            raise ConfigError(
                f"disk_dir: {path} has index schema {version}, this kvtier reads "
                f"{SCHEMA_VERSION}; use the kvtier that wrote it, or open it with a store to "
                f"migrate an older one"
            )
        yield conn
    except sqlite3.Error as exc:
        raise UnreadableRoot(f"cannot read {path}: {exc}") from None
    finally:
        conn.close()


def namespace_summaries(root: Path) -> list[NamespaceSummary]:
    """Every namespace folder under ``root`` (sorted by digest), with the index's figures."""
    root = Path(root)
    with read_index(root) as conn:
        figures = {
            ns: (n, size, oldest, newest)
            for ns, n, size, oldest, newest in conn.execute(
                f"SELECT ns, COUNT(*), SUM({_CHARGE}), MIN(access_ns), MAX(access_ns) "
                "FROM records WHERE state = 1 GROUP BY ns"
            )
        }
        quarantined = dict(conn.execute("SELECT ns, SUM(charge) FROM quarantine GROUP BY ns"))
    found = []
    for name in sorted(set(namespace_folders(root)) | set(figures)):
        n, size, oldest, newest = figures.get(name, (0, 0, 0, 0))
        found.append(
            NamespaceSummary(
                name, read_namespace(root / name), n, size, oldest, newest, quarantined.get(name, 0)
            )
        )
    return found


def namespace_blocks(root: Path, digest_hex: str) -> list[BlockSummary]:
    """The ready records of one namespace, most recently used first."""
    with read_index(Path(root)) as conn:
        return [
            BlockSummary(key, record_id, size - HEADER_BYTES, used)
            for key, record_id, size, used in conn.execute(
                "SELECT key, id, record_bytes, access_ns FROM records "
                "WHERE ns = ? AND state = 1 ORDER BY access_ns DESC, id DESC",
                (digest_hex,),
            )
        ]


def root_usage(root: Path) -> RootUsage:
    """The cap, what it covers now, and the file system's free space and floor."""
    from kvtier.store.disk.store import FLOOR_FRACTION, FLOOR_MAX_BYTES

    root = Path(root)
    with read_index(root) as conn:
        meta = dict(conn.execute("SELECT name, value FROM meta"))
        used = conn.execute("SELECT used_bytes FROM totals").fetchone()[0]
        trash = conn.execute("SELECT COALESCE(SUM(charge), 0) FROM trash").fetchone()[0]
        q_bytes, q_entries = conn.execute(
            "SELECT COALESCE(SUM(charge), 0), COUNT(*) FROM quarantine"
        ).fetchone()
    st = os.statvfs(root)
    total = st.f_blocks * st.f_frsize
    ppm = meta.get("low_watermark_ppm")
    return RootUsage(
        meta.get("capacity_bytes"),
        None if ppm is None else ppm / 1_000_000,
        used,
        used + index_files_bytes(root, len(namespace_folders(root))) + folders_bytes(root),
        trash,
        q_bytes,
        q_entries,
        st.f_bavail * st.f_frsize,
        total,
        min(int(total * FLOOR_FRACTION), FLOOR_MAX_BYTES),
    )


def read_namespace(folder: Path) -> Namespace | None:
    """The namespace a folder's namespace.json describes; None if missing or unreadable."""
    try:
        fd = layout.open_private_file(folder / layout.NAMESPACE_FILE, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return Namespace.from_json(os.read(fd, 1 << 20).decode("utf-8", "replace"))
    except ConfigError:
        return None
    finally:
        os.close(fd)
