"""``kvtier.store.disk.gc.collect`` beside the stores and checks that share its root.

A collection moves rows to trash, then unlinks their files: the I/O seam (``io=``) lets a test
act in between, with the collection's evictions in flight.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from kvtier.format import HEADER_BYTES
from kvtier.store import DiskStore
from kvtier.store.base import Problem
from kvtier.store.disk import layout
from kvtier.store.disk.gc import collect
from kvtier.store.disk.inspect import root_usage
from kvtier.store.disk.reader import RecordReader
from kvtier.store.disk.record_io import RecordIO
from kvtier.store.disk.writer import RecordWriter
from tests.support.store import PAYLOAD_BYTES, key_of, payload_of

OpenDisk = Callable[..., DiskStore]
RECORD = HEADER_BYTES + PAYLOAD_BYTES


class BeforeUnlinkWriter(RecordWriter):
    """Calls ``hook(path)`` before the first unlink of a record file, then unlinks as usual."""

    def __init__(self, hook: Callable[[Path], None]) -> None:
        super().__init__()
        self.hook = hook
        self.called = False

    def remove_many(self, paths: list[Path]) -> list[bool]:
        for path in paths:
            if not self.called and path.suffix == ".kvb":
                self.called = True
                self.hook(path)
        return super().remove_many(paths)


class GcKilled(BaseException):
    """Ends a collection between its index transaction and its unlinks, as a SIGKILL would."""


class KilledBeforeUnlinkWriter(RecordWriter):
    def remove_many(self, paths: list[Path]) -> list[bool]:
        raise GcKilled


class OnFirstReadReader(RecordReader):
    """Calls ``hook()`` before the first record read (inside a verify, after its listing)."""

    def __init__(self, hook: Callable[[], None]) -> None:
        super().__init__()
        self.hook: Callable[[], None] | None = hook

    def read_into(self, path: Path, out: memoryview) -> memoryview:
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return super().read_into(path, out)


def fill(store: DiskStore, keys: range) -> None:
    for i in keys:
        assert store.put(key_of(i), payload_of(i))


def test_verify_beside_a_collection_in_flight_reports_nothing(open_disk: OpenDisk) -> None:
    store = open_disk()
    fill(store, range(4))
    seen: list[Problem] = []
    writer = BeforeUnlinkWriter(lambda path: seen.extend(store.verify()))
    assert collect(store.root, older_than_s=0, writer=writer).records == 4
    assert writer.called
    assert seen == [], "the collection's evictions in flight are not a dead writer's trash"
    assert store.verify() == []


def test_a_store_refresh_leaves_a_running_collection_its_evictions(open_disk: OpenDisk) -> None:
    store = open_disk()
    fill(store, range(4))
    still_there: list[bool] = []

    def refresh_first(path: Path) -> None:
        store.refresh()  # reclaims the trash of dead sessions
        still_there.append(path.exists())

    assert (
        collect(store.root, older_than_s=0, writer=BeforeUnlinkWriter(refresh_first)).records == 4
    )
    assert still_there == [True], "a running collection is not a dead session"
    assert store.verify() == []


def test_verify_does_not_report_dead_trash_that_a_store_reclaimed_meanwhile(
    open_disk: OpenDisk, root: Path
) -> None:
    store = open_disk()
    fill(store, range(4))
    other = open_disk()  # both open before the kill: a store reclaims dead trash at open
    checker = open_disk(
        io=RecordIO(reader=OnFirstReadReader(other.refresh))
    )  # refresh after verify's listing
    with pytest.raises(GcKilled):  # leaves 2 evicted files in the trash of a dead session
        collect(
            root, to_bytes=store.footprint_bytes() - 2 * RECORD, writer=KilledBeforeUnlinkWriter()
        )
    assert checker.verify() == [], "the dead session's trash was gone before the report"
    checker.refresh()
    assert sorted(checker.keys()) == [key_of(i) for i in (2, 3)]
    assert checker.verify() == []


def test_gc_to_size_beside_an_open_store_leaves_the_footprint_at_most_the_size(
    open_disk: OpenDisk, root: Path
) -> None:
    store = open_disk(records=400)
    fill(store, range(300))
    # Another writer's truncating checkpoint just emptied the index's WAL (Index._write does
    # so when the WAL is past its bound): the collection's own index writes regrow it.
    with closing(sqlite3.connect(root / layout.INDEX_FILE)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    target = root_usage(root).footprint_bytes - 20 * RECORD
    assert collect(root, to_bytes=target).records == 20
    assert root_usage(root).footprint_bytes <= target
    assert store.verify() == []
