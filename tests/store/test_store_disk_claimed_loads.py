"""``DiskStore.get_into_when``: a record the page cache holds goes straight into the row once
the load is claimed; any other record through the bounce buffer, the row written only after
the claim. Either way an abandoned load (claim False) never writes the row, and a record that
fails its checks is a miss and is quarantined. With an ``AbandonableLoad`` as the claim the
native reader claims inside its one call."""

from __future__ import annotations

import errno
import os
import tempfile
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
    native.record_reader() is None, reason="kvtier.native._recordread is not built"
)


def cached_io(reader: RecordReader | None = None) -> RecordIO:
    """Writes through the page cache, fsynced and kept there: the records stay resident.
    Read by ``reader``, the native reader unless given."""
    writer = RecordWriter(fsync="data", direct_writes=False, drop_written_pages=False)
    return RecordIO(writer, reader if reader is not None else NativeRecordReader())


def stored(store: DiskStore, n: int = 1) -> Path:
    row = aligned_buffer(PAYLOAD_BYTES)
    row[:] = payload_of(n)
    assert store.put(key_of(n), row)
    path = store.record_path(key_of(n))
    assert path is not None
    return path


def resident_store(
    open_disk: OpenDisk, reader: RecordReader | None = None
) -> tuple[DiskStore, Path]:
    store = open_disk(io=cached_io(reader))
    path = stored(store)
    if not native.resident(path):
        pytest.skip("the page cache did not keep the buffered write (memory pressure?)")
    return store, path


def flip_a_payload_bit(path: Path, resident: bool) -> None:
    """Damage the record's payload and leave its pages cached (``resident``), so the next
    read is a copy from memory, or dropped, so it goes to the device."""
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, HEADER_BYTES + 5)
        os.pwrite(fd, bytes([byte[0] ^ 0x40]), HEADER_BYTES + 5)
        os.fsync(fd)
        if not resident:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if native.resident(path) != resident:
        pytest.skip("the kernel did not keep (or drop) the record's pages as asked")


class Claims(FixedClaim):
    """A load's claim that records what the row and the bounce buffer held when it was asked
    (claimed from Python: no native cell)."""

    __slots__ = ("bounce", "row", "seen")

    def __init__(self, row: memoryview, bounce: memoryview, grant: bool = True) -> None:
        super().__init__(grant)
        self.row, self.bounce = row, bounce
        self.seen: list[tuple[bool, bool]] = []

    def claim(self) -> bool:
        self.seen.append((any(bytes(self.row)), any(bytes(self.bounce))))
        return super().claim()


def test_a_resident_record_is_claimed_then_read_straight_into_the_row(
    open_disk: OpenDisk,
) -> None:
    store, _ = resident_store(open_disk)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    claim = Claims(row, bounce)
    assert store.get_into_when(key_of(1), row, claim, bounce)
    assert bytes(row) == payload_of(1)
    assert claim.seen == [(False, False)], "claimed before any byte moved; no bounce copy"
    assert (store.stats().hits, store.stats().page_cache_hits) == (1, 1)


def test_an_abandoned_resident_load_never_writes_the_row(open_disk: OpenDisk) -> None:
    store, _ = resident_store(open_disk)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    assert not store.get_into_when(key_of(1), row, Claims(row, bounce, grant=False), bounce)
    assert not any(bytes(row))
    assert store.contains(key_of(1)), "an abandoned load is no fault of the record"
    assert store.get(key_of(1)) == payload_of(1)


def test_a_resident_record_that_fails_its_checksum_is_a_quarantined_miss(
    open_disk: OpenDisk,
) -> None:
    """The claimed row may hold the bad bytes; the load fails, so they are never served."""
    store, path = resident_store(open_disk)
    flip_a_payload_bit(path, resident=True)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    assert not store.get_into_when(key_of(1), row, Claims(row, bounce), bounce)
    assert store.stats().corrupt == {"checksum": 1}
    assert not store.contains(key_of(1))


def test_a_page_evicted_during_the_claimed_read_is_a_clean_miss(open_disk: OpenDisk) -> None:
    """The claimed read never waits for the device (RWF_NOWAIT): pages dropped between the
    probe and the read end it as a miss; the record stays, and reads again later."""

    class EvictsBeforeTheRead(NativeRecordReader):
        def read_resident(
            self, fd: int, path: Path, out: memoryview, checksum: bool
        ) -> tuple[memoryview, int | None] | None:
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            if native.resident(path):
                os.close(fd)
                pytest.skip("the kernel kept the record's pages after POSIX_FADV_DONTNEED")
            read = super().read_resident(fd, path, out, checksum)
            if read is not None:
                # RWF_NOWAIT still starts read-ahead on a miss; on a device that answers at
                # once (a virtio disk over the host's cache) the pages can be back before
                # the read looks again. The seam test below covers the miss anywhere.
                pytest.skip("the kernel read the dropped pages back within the RWF_NOWAIT read")
            return read

    io = EvictsBeforeTheRead()
    store, _ = resident_store(open_disk, io)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    assert not store.get_into_when(key_of(1), row, Claims(row, bounce), bounce)
    assert store.stats().misses == 1 and store.stats().corrupt == {}
    assert store.contains(key_of(1))
    assert store.get(key_of(1)) == payload_of(1)


def test_a_resident_read_that_finds_a_page_gone_is_a_clean_miss(open_disk: OpenDisk) -> None:
    """The same through the reader's seam, on any kernel: the native read says a page left the
    page cache (None) after writing part of the row; the load is a miss, no fault of the
    record, which stays and reads again later."""

    class PageGone(NativeRecordReader):
        def read_resident(
            self, fd: int, path: Path, out: memoryview, checksum: bool
        ) -> tuple[memoryview, int | None] | None:
            os.close(fd)
            out[:16] = b"\xff" * 16  # partly written, as the real read may leave it
            return None

    store, _ = resident_store(open_disk, PageGone())
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    assert not store.get_into_when(key_of(1), row, Claims(row, bounce), bounce)
    assert store.stats().misses == 1 and store.stats().corrupt == {}
    assert store.contains(key_of(1))
    assert store.get(key_of(1)) == payload_of(1)


def test_a_record_the_page_cache_lacks_goes_through_the_bounce_buffer(
    open_disk: OpenDisk,
) -> None:
    store = open_disk()  # O_DIRECT writes: nothing left in the page cache
    path = stored(store)
    if native.resident(path):
        pytest.skip("this file system keeps O_DIRECT writes in the page cache")
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    claim = Claims(row, bounce)
    assert store.get_into_when(key_of(1), row, claim, bounce)
    assert bytes(row) == payload_of(1)
    assert claim.seen == [(False, True)], "read and verified in the bounce buffer, then claimed"
    assert (store.stats().hits, store.stats().page_cache_hits) == (1, 0)
    assert not store.get_into_when(key_of(1), row, Claims(row, bounce, grant=False), bounce)


def test_without_page_cache_reads_every_load_goes_through_the_bounce_buffer(
    open_disk: OpenDisk,
) -> None:
    io = NativeRecordReader(page_cache_reads=False)
    store, _ = resident_store(open_disk, io)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    claim = Claims(row, bounce)
    assert store.get_into_when(key_of(1), row, claim, bounce)
    assert claim.seen == [(False, True)]
    assert bytes(row) == payload_of(1)


class OneCallReader(NativeRecordReader):
    """Fails the test if a load takes the two-call path (a GIL hand-over more per block)."""

    def read_unless_resident(self, *args: object) -> object:
        raise AssertionError("a load with a native claim cell took the two-call path")

    def read_resident(self, *args: object) -> object:
        raise AssertionError("a load with a native claim cell took the two-call path")


def one_call_io() -> OneCallReader:
    return OneCallReader()


def test_an_abandonable_load_is_claimed_by_the_reader_in_its_one_call(
    open_disk: OpenDisk,
) -> None:
    """With an ``AbandonableLoad`` as its claim, the native reader claims the row between its
    probe and its read: one GIL-free call for a resident record."""
    store, _ = resident_store(open_disk, one_call_io())
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert store.get_into_when(key_of(1), row, load, bounce)
    assert bytes(row) == payload_of(1)
    assert not any(bytes(bounce)), "read straight into the row"
    assert load.state is LoadState.WRITTEN, "claimed and written; the tier finishes it"
    assert (store.stats().hits, store.stats().page_cache_hits) == (1, 1)


def test_an_abandoned_load_is_never_read_into_by_the_reader(open_disk: OpenDisk) -> None:
    store, _ = resident_store(open_disk, one_call_io())
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert load.abandon()
    assert not store.get_into_when(key_of(1), row, load, bounce)
    assert not any(bytes(row)) and not any(bytes(bounce))
    assert load.state is LoadState.ABANDONED
    assert store.contains(key_of(1)), "an abandoned load is no fault of the record"


def test_a_damaged_resident_record_read_by_the_one_call_is_a_quarantined_miss(
    open_disk: OpenDisk,
) -> None:
    store, path = resident_store(open_disk, one_call_io())
    flip_a_payload_bit(path, resident=True)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    assert not store.get_into_when(key_of(1), row, AbandonableLoad(), bounce)
    assert store.stats().corrupt == {"checksum": 1}
    assert not store.contains(key_of(1))


def test_an_abandonable_load_of_a_record_the_page_cache_lacks_is_claimed_after_its_read(
    open_disk: OpenDisk,
) -> None:
    store = open_disk(
        io=RecordIO(reader=OneCallReader())
    )  # O_DIRECT writes: nothing left in the page cache
    path = stored(store)
    if native.resident(path):
        pytest.skip("this file system keeps O_DIRECT writes in the page cache")
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert store.get_into_when(key_of(1), row, load, bounce)
    assert bytes(row) == payload_of(1) and bytes(bounce) == payload_of(1)
    assert load.state is LoadState.WRITTEN
    assert (store.stats().hits, store.stats().page_cache_hits) == (1, 0)
    bounce[:] = bytes(PAYLOAD_BYTES)
    row[:] = bytes(PAYLOAD_BYTES)
    abandoned = AbandonableLoad()
    assert abandoned.abandon()
    assert not store.get_into_when(key_of(1), row, abandoned, bounce)
    assert not any(bytes(row)), "read into the bounce buffer only; never copied"


def test_a_damaged_record_the_page_cache_lacks_is_a_quarantined_miss_in_one_call(
    open_disk: OpenDisk,
) -> None:
    """Read into the bounce buffer, claimed and copied in the same call, verified after: the
    row may hold the bad bytes, but the load fails, so they are never served."""
    store = open_disk(io=RecordIO(reader=OneCallReader()))
    flip_a_payload_bit(stored(store), resident=False)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert not store.get_into_when(key_of(1), row, load, bounce)
    assert load.state is LoadState.WRITTEN, "claimed, so the tier reports the load failed"
    assert store.stats().corrupt == {"checksum": 1}
    assert not store.contains(key_of(1))


def test_a_damaged_record_read_for_an_abandoned_load_is_still_quarantined(
    open_disk: OpenDisk,
) -> None:
    """The read into the bounce buffer happened; the claim after it failed. The row stays
    untouched, and the bytes read are checked all the same."""
    store = open_disk(io=RecordIO(reader=OneCallReader()))
    flip_a_payload_bit(stored(store), resident=False)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert load.abandon()
    assert not store.get_into_when(key_of(1), row, load, bounce)
    assert not any(bytes(row))
    assert store.stats().corrupt == {"checksum": 1}
    assert not store.contains(key_of(1))


# -- a kernel that refuses RWF_NOWAIT (tmpfs) ------------------------------------------------


class RefusesNowait(NativeRecordReader):
    """The reader as on a file system without ``RWF_NOWAIT``: a claimed read is refused before
    it reads a byte (as the kernel answers ``EOPNOTSUPP`` at the first ``preadv2``)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0
        claim_move = native.claim_ops()[0]
        claiming, unless_resident = self._claiming, self._resident[0]

        def refused_claiming(path, header, bounce, out, cell, direct, checksum):  # type: ignore[no-untyped-def]
            fd = unless_resident(path, header, bounce, direct, checksum)[0]
            if fd < 0:
                return claiming(path, header, bounce, out, cell, direct, checksum)
            os.close(fd)
            self.refused += 1
            claimed = claim_move(cell, 0, 1)  # the reader claims before its read
            into = 1 if claimed else 2
            return (into, 6, errno.EOPNOTSUPP, 0, 0, False, claimed, None)

        def refused_resident(fd, header, out, checksum):  # type: ignore[no-untyped-def]
            os.close(fd)
            self.refused += 1
            return (6, errno.EOPNOTSUPP, 0, True, None)

        self._claiming = refused_claiming
        self._resident = (unless_resident, refused_resident)


class Releasable(Claims):
    """A claim without a native cell that can be given back, as ``AbandonableLoad``'s."""

    def __init__(self, row: memoryview, bounce: memoryview) -> None:
        super().__init__(row, bounce)
        self.released = 0

    def release(self) -> bool:
        self.released += 1
        return True


def test_a_refused_nowait_read_gives_the_claim_back_and_reads_through_the_bounce_buffer(
    open_disk: OpenDisk,
) -> None:
    """The first claimed read on such a file system is not lost: the claim is given back
    and the record read the other way; every later load goes that way at once."""
    io = RefusesNowait()
    store, _ = resident_store(open_disk, io)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert store.get_into_when(key_of(1), row, load, bounce)
    assert bytes(row) == payload_of(1)
    assert load.state is LoadState.WRITTEN, "claimed again after the bounce read, and written"
    assert io.refused == 1 and not io.reads_resident_into(row)
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.corrupt) == (1, 0, {})

    again = aligned_buffer(PAYLOAD_BYTES)
    assert store.get_into_when(key_of(1), again, AbandonableLoad(), bounce)
    assert bytes(again) == payload_of(1) and io.refused == 1


def test_a_refused_nowait_read_in_two_calls_is_served_when_the_claim_can_be_given_back(
    open_disk: OpenDisk,
) -> None:
    io = RefusesNowait()
    io._claiming = None  # the two-call path: the store claims between its two calls
    store, _ = resident_store(open_disk, io)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    claim = Releasable(row, bounce)
    assert store.get_into_when(key_of(1), row, claim, bounce)
    assert bytes(row) == payload_of(1)
    assert claim.released == 1
    assert claim.seen == [(False, False), (False, True)], "claimed, given back, claimed again"


def test_a_refused_nowait_read_with_a_claim_that_cannot_be_given_back_is_a_clean_miss(
    open_disk: OpenDisk,
) -> None:
    io = RefusesNowait()
    io._claiming = None
    store, _ = resident_store(open_disk, io)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    claim = Claims(row, bounce)
    assert not store.get_into_when(key_of(1), row, claim, bounce)
    assert claim.seen == [(False, False)] and not any(bytes(row))
    assert store.stats().corrupt == {} and store.contains(key_of(1))
    assert store.get_into_when(key_of(1), row, Claims(row, bounce), bounce), "served next time"
    assert bytes(row) == payload_of(1)


def _refuses_nowait(folder: Path) -> bool:
    probe = folder / "nowait-probe"
    probe.write_bytes(b"\0" * 4096)
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        return False
    except OSError as exc:
        return exc.errno == errno.EOPNOTSUPP
    finally:
        os.close(fd)
        probe.unlink()


def test_the_first_load_from_a_tmpfs_folder_is_served(open_disk: OpenDisk, namespace) -> None:  # type: ignore[no-untyped-def]
    """The real kernel: tmpfs keeps every record in the page cache and refuses RWF_NOWAIT."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm on this machine")
    with tempfile.TemporaryDirectory(dir=shm) as folder:
        if not _refuses_nowait(Path(folder)):
            pytest.skip("/dev/shm here accepts RWF_NOWAIT reads: nothing to fall back from")
        store = open_disk(root=Path(folder) / "cache", io=cached_io())
        stored(store)
        row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
        assert store.get_into_when(key_of(1), row, AbandonableLoad(), bounce)
        assert bytes(row) == payload_of(1)
        assert store.stats().misses == 0
        store.close()
