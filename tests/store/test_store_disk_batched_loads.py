"""``DiskStore.get_many_into_when``: a list of loads read in one native call (one GIL hand-over
for the list), each still claimed before its row is written, verified, counted and, when bad,
quarantined as a load of its own would be."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier import native
from kvtier.dataplane.abandonable import AbandonableLoad, LoadState
from kvtier.format import HEADER_BYTES
from kvtier.store import DiskStore, NativeRecordReader, RecordIO, RecordReader, RecordWriter
from kvtier.store.base import FixedClaim
from tests.support.store import PAYLOAD_BYTES, aligned_buffer, key_of, payload_of

OpenDisk = Callable[..., DiskStore]

pytestmark = pytest.mark.skipif(
    native.claiming_batch_reader() is None, reason="kvtier.native._recordread is not built"
)


class CountingReader(NativeRecordReader):
    """Counts the reads a load makes: one call for the list, or one per record."""

    def __init__(self) -> None:
        super().__init__()
        self.one_calls = 0
        self.list_calls = 0

    def read_claiming(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.one_calls += 1
        return super().read_claiming(*args, **kwargs)

    def read_claiming_many(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.list_calls += 1
        return super().read_claiming_many(*args, **kwargs)


def store_io(reader: RecordReader) -> RecordIO:
    """``reader`` behind a writer that fsyncs its data."""
    return RecordIO(RecordWriter(fsync="data"), reader)


def fill(store: DiskStore, ids: range) -> list[Path]:
    paths = []
    for n in ids:
        row = aligned_buffer(PAYLOAD_BYTES)
        row[:] = payload_of(n)
        assert store.put(key_of(n), row)
        path = store.record_path(key_of(n))
        assert path is not None
        paths.append(path)
    return paths


def rows(count: int) -> list[memoryview]:
    return [aligned_buffer(PAYLOAD_BYTES) for _ in range(count)]


def make_resident(path: Path) -> None:
    with open(path, "rb") as f:
        f.read()


def damage(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, HEADER_BYTES + 9)
        os.pwrite(fd, bytes([byte[0] ^ 0x01]), HEADER_BYTES + 9)
    finally:
        os.close(fd)


def test_a_list_of_loads_is_read_in_one_call_each_as_its_own_load_would_be(
    open_disk: OpenDisk,
) -> None:
    io = CountingReader()
    store = open_disk(records=16, io=store_io(io))
    paths = fill(store, range(6))
    make_resident(paths[0])  # one from the page cache, the rest from the device (O_DIRECT)
    damage(paths[3])
    keys = [key_of(n) for n in range(6)] + [key_of(99)]  # the last is not stored
    outs = rows(len(keys))
    loads = [AbandonableLoad() for _ in keys]
    assert loads[4].abandon()
    answers = store.get_many_into_when(keys, outs, loads, aligned_buffer(PAYLOAD_BYTES))

    assert answers == [True, True, True, False, False, True, False]
    for n in (0, 1, 2, 5):
        assert bytes(outs[n]) == payload_of(n)
        assert loads[n].state is LoadState.WRITTEN, "claimed and written; the tier finishes it"
    assert not any(bytes(outs[4])), "a load abandoned before its turn is never written"
    assert (io.list_calls, io.one_calls) == (1, 0)
    stats = store.stats()
    assert stats.hits == 4 and stats.corrupt == {"checksum": 1}
    assert stats.misses == 2, "the damaged record and the key never stored"
    assert not store.contains(key_of(3)), "quarantined"
    assert store.contains(key_of(4)), "an abandoned load is no fault of the record"
    assert not store._pins, "every record unpinned"


def test_a_load_abandoned_after_its_read_never_writes_its_row(open_disk: OpenDisk) -> None:
    store = open_disk(records=16, io=store_io(CountingReader()))
    fill(store, range(3))
    keys = [key_of(n) for n in range(3)]
    outs = rows(3)
    loads = [AbandonableLoad() for _ in keys]
    loads[1].native_cell[0] = 3  # ABANDONED, as the scheduler's abandon leaves it
    answers = store.get_many_into_when(keys, outs, loads, aligned_buffer(PAYLOAD_BYTES))
    assert answers == [True, False, True]
    assert not any(bytes(outs[1]))


def test_claims_without_a_cell_are_read_one_by_one(open_disk: OpenDisk) -> None:
    io = CountingReader()
    store = open_disk(records=16, io=store_io(io))
    fill(store, range(3))
    outs = rows(3)
    answers = store.get_many_into_when(
        [key_of(n) for n in range(3)], outs, [FixedClaim()] * 3, aligned_buffer(PAYLOAD_BYTES)
    )
    assert answers == [True] * 3 and io.list_calls == 0
    assert [bytes(o) for o in outs] == [payload_of(n) for n in range(3)]


def test_a_failing_list_read_unpins_every_record(open_disk: OpenDisk) -> None:
    class Fails(CountingReader):
        def read_claiming_many(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise MemoryError("no room for the answers")

    store = open_disk(records=16, io=store_io(Fails()))
    fill(store, range(3))
    with pytest.raises(MemoryError):
        store.get_many_into_when(
            [key_of(n) for n in range(3)],
            rows(3),
            [AbandonableLoad() for _ in range(3)],
            aligned_buffer(PAYLOAD_BYTES),
        )
    assert not store._pins


def test_a_refused_nowait_read_in_a_list_is_read_again_the_other_way(
    open_disk: OpenDisk,
) -> None:
    """As on tmpfs: claimed, refused before a byte is read; the claim is given back and that
    record read through the bounce buffer, the others as the list read them."""
    io = NativeRecordReader()
    claim_move = native.claim_ops()[0]  # type: ignore[index]
    real = io._claiming_many

    def first_refused(paths, headers, bounce, outs, cells, direct, checksum):  # type: ignore[no-untyped-def]
        rest = headers[HEADER_BYTES:]
        answers = real(paths[1:], rest, bounce, outs[1:], cells[1:], direct, checksum)
        assert claim_move(cells[0], 0, 1)
        return [(1, 6, errno.EOPNOTSUPP, 0, 0, False, True, None), *answers]

    io._claiming_many = first_refused
    writer = RecordWriter(fsync="data", direct_writes=False, drop_written_pages=False)
    store = open_disk(records=16, io=RecordIO(writer, io))
    fill(store, range(3))
    outs = rows(3)
    loads = [AbandonableLoad() for _ in range(3)]
    answers = store.get_many_into_when(
        [key_of(n) for n in range(3)], outs, loads, aligned_buffer(PAYLOAD_BYTES)
    )
    assert answers == [True] * 3
    assert [bytes(o) for o in outs] == [payload_of(n) for n in range(3)]
    assert all(load.state is LoadState.WRITTEN for load in loads)
    assert store.stats().misses == 0


def test_the_native_list_read_refuses_lists_that_do_not_match() -> None:
    read_many = native.claiming_batch_reader()
    assert read_many is not None
    headers, bounce = aligned_buffer(2 * HEADER_BYTES), aligned_buffer(PAYLOAD_BYTES)
    with pytest.raises(ValueError):
        read_many([b"/nonexistent"], headers, bounce, [], [], False, True)
    larger = aligned_buffer(2 * PAYLOAD_BYTES)
    with pytest.raises(ValueError):
        read_many([b"/a", b"/b"], headers, larger, rows(2), [bytearray(4)] * 2, False, True)
    with pytest.raises(ValueError):
        read_many([b"/a", b"/b"], headers, bounce, rows(2), [bytearray(2)] * 2, False, True)
    with pytest.raises(TypeError):
        read_many(["/a"], headers[:HEADER_BYTES], bounce, rows(1), [bytearray(4)], False, True)


def test_a_load_abandoned_after_its_row_was_written_is_neither_served_nor_checked(
    open_disk: OpenDisk,
) -> None:
    """The scheduler may abandon a written load while its thread reads the rest of the list;
    the row is then vLLM's again (maybe reused already), so the store reads it no more: no
    hit, and no verdict on the record from bytes that may no longer be its own."""
    io = CountingReader()
    store = open_disk(records=16, io=store_io(io))
    paths = fill(store, range(2))
    damage(paths[0])
    loads = [AbandonableLoad() for _ in range(2)]
    real = io._claiming_many

    def abandoned_meanwhile(*args):  # type: ignore[no-untyped-def]
        answers = real(*args)
        assert loads[0].state is LoadState.WRITTEN and loads[0].abandon()
        return answers

    io._claiming_many = abandoned_meanwhile
    outs = rows(2)
    answers = store.get_many_into_when(
        [key_of(0), key_of(1)], outs, loads, aligned_buffer(PAYLOAD_BYTES)
    )
    assert answers == [False, True]
    assert store.stats().corrupt == {} and store.contains(key_of(0))
    assert store.stats().hits == 1


def test_a_record_read_for_a_load_abandoned_during_its_read_is_not_checked_in_a_list(
    open_disk: OpenDisk,
) -> None:
    """In a list read the bounce buffer serves every record in turn: a record left there for a
    load abandoned during its read (claim refused after the read) is overwritten by the next
    ones before the store could check it, so it is not judged from those bytes."""
    io = CountingReader()
    store = open_disk(records=16, io=store_io(io))
    fill(store, range(2))
    loads = [AbandonableLoad() for _ in range(2)]
    real = io._claiming_many

    def abandoned_during_the_first_read(paths, headers, bounce, outs, cells, direct, checksum):  # type: ignore[no-untyped-def]
        answers = real(paths, headers, bounce, outs, cells, direct, checksum)
        bounce[:] = b"\xa5" * len(bounce)  # the next record's bytes, as far as record 0 knows
        _, status, error, detail, detail2, refused, nowait, _ = answers[0]
        answers[0] = (4, status, error, detail, detail2, refused, nowait, None)
        return answers

    io._claiming_many = abandoned_during_the_first_read
    answers = store.get_many_into_when(
        [key_of(0), key_of(1)], rows(2), loads, aligned_buffer(PAYLOAD_BYTES)
    )
    assert answers == [False, True]
    assert store.stats().corrupt == {} and store.contains(key_of(0))
