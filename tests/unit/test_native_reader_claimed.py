"""The record reader's two halves for a load that may write its row only once claimed.

``read_unless_resident`` makes the usual checks and, when the page cache holds the whole
record, reads nothing and hands back an open descriptor; otherwise it reads the record into
the caller's bounce buffer as ``read_checked`` does. ``read_resident`` then reads the record
straight into the claimed row with ``RWF_NOWAIT`` (never waiting for the device), hashing each
chunk as it lands. Buffered reads everywhere hash chunk by chunk the same way, so the chunked
hash is checked against the xxhash package at lengths around a chunk's and a block's edges.
That the one-pass read is faster is measured by
``python -m benchmarks disk-read --page-cache warm``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import xxhash

from kvtier import native
from kvtier.errors import CorruptRecordError
from kvtier.format.record import HEADER_BYTES
from kvtier.store import NativeRecordReader, RecordReader
from tests.support.record_files import (
    DAMAGES,
    drop_pages,
    header_of,
    write_buffered,
    write_record,
)
from tests.support.store import aligned_buffer

PAYLOAD = 16 * 4096

pytestmark = pytest.mark.skipif(
    native.record_reader() is None, reason="kvtier.native._recordread is not built"
)


def chunk() -> int:
    from kvtier.native import _recordread  # type: ignore[attr-defined]

    return int(_recordread.RESIDENT_CHUNK)


def written(path: Path, length: int, seed: int = 5) -> bytes:
    """A record of ``length`` payload bytes written through the page cache (left resident)."""
    payload = random.Random(seed).randbytes(length)
    write_record(path, payload)
    return payload


@pytest.mark.parametrize(
    "offset", [-1025, -1024, -1, 0, 1, 63, 1024, 1025], ids=lambda o: f"chunk{o:+d}"
)
@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_chunked_buffered_reads_hash_like_xxhash_at_every_edge(
    tmp_path: Path, chunks: int, offset: int, aligned: bool
) -> None:
    """Buffered reads go chunk by chunk: each length around a chunk's edge (and an XXH3
    block's: 1,024 bytes) hashes as the package hashes the whole payload. An aligned row of a
    record the page cache holds is hashed and copied in one pass (streaming stores); an
    unaligned one is copied, then hashed."""
    path = tmp_path / "r.kvb"
    payload = written(path, chunks * chunk() + offset)
    out = aligned_buffer(len(payload)) if aligned else memoryview(bytearray(len(payload) + 1))[1:]
    header, checksum, _ = NativeRecordReader().read_checked(path, out, checksum=True)
    assert bytes(out) == payload
    assert bytes(header) == path.read_bytes()[:HEADER_BYTES]
    assert checksum == xxhash.xxh3_64_intdigest(payload)


@pytest.mark.parametrize("length", [241, 1024, 1025, 4096, PAYLOAD, 3 * 256 * 1024 + 100])
def test_a_resident_record_is_opened_unread_then_read_into_the_claimed_row(
    tmp_path: Path, length: int
) -> None:
    path = tmp_path / "r.kvb"
    payload = written(path, length)
    assert native.resident(path), "a record just written through the page cache is held"
    io = NativeRecordReader()
    bounce, row = aligned_buffer(length), aligned_buffer(length)
    assert io.reads_resident_into(bounce)
    fd = io.read_unless_resident(path, bounce, checksum=True)
    assert isinstance(fd, int)
    assert not any(bytes(bounce)), "nothing is read before the row is claimed"
    read = io.read_resident(fd, path, row, checksum=True)
    assert read is not None
    header, checksum = read
    assert bytes(row) == payload
    assert bytes(header) == path.read_bytes()[:HEADER_BYTES]
    assert checksum == xxhash.xxh3_64_intdigest(payload)
    with pytest.raises(OSError):
        os.fstat(fd)  # read_resident closed it


def test_a_record_the_page_cache_lacks_is_read_into_the_bounce_buffer(folder: Path) -> None:
    path = folder / "r.kvb"
    payload = random.Random(6).randbytes(PAYLOAD)
    write_buffered(path, payload)  # fsynced: clean pages, which the kernel can drop
    drop_pages(path)
    if native.resident(path):
        pytest.skip("the kernel kept the record's pages after POSIX_FADV_DONTNEED")
    bounce = aligned_buffer(PAYLOAD)
    read = NativeRecordReader().read_unless_resident(path, bounce, checksum=True)
    assert not isinstance(read, int)
    header, checksum = read
    assert bytes(bounce) == payload
    assert bytes(header) == header_of(payload)
    assert checksum == xxhash.xxh3_64_intdigest(payload)
    assert not native.resident(path), "read O_DIRECT, as read_checked reads it"


def test_a_page_evicted_after_the_probe_ends_the_read_unserved(folder: Path) -> None:
    """The claimed read never waits for the device: a page gone since the probe is a miss."""
    path = folder / "r.kvb"
    write_buffered(path, random.Random(7).randbytes(PAYLOAD))
    io = NativeRecordReader()
    fd = io.read_unless_resident(path, aligned_buffer(PAYLOAD), checksum=True)
    assert isinstance(fd, int)
    drop_pages(path)
    if native.resident(path):
        os.close(fd)
        pytest.skip("the kernel kept the record's pages after POSIX_FADV_DONTNEED")
    assert io.read_resident(fd, path, aligned_buffer(PAYLOAD), checksum=True) is None
    assert not native.resident(path), "RWF_NOWAIT started no read of the missing pages"


def test_with_page_cache_reads_off_nothing_is_read_in_two_halves() -> None:
    assert not NativeRecordReader(page_cache_reads=False).reads_resident_into(aligned_buffer(4096))
    assert not RecordReader().reads_resident_into(aligned_buffer(4096))
    assert not NativeRecordReader().reads_resident_into(memoryview(bytes(4096)))


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_file_is_refused_as_read_checked_refuses_it(tmp_path: Path, damage: str) -> None:
    apply, expected = DAMAGES[damage]
    if damage == "other-user" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    path = tmp_path / "r.kvb"
    write_record(path, random.Random(3).randbytes(PAYLOAD))
    apply(path)
    bounce = aligned_buffer(PAYLOAD)
    with pytest.raises((CorruptRecordError, OSError)) as caught:
        NativeRecordReader().read_unless_resident(path, bounce, checksum=True)
    error = caught.value
    if isinstance(expected, str):
        assert isinstance(error, CorruptRecordError) and error.reason == expected, error
    else:
        assert isinstance(error, OSError) and error.errno == expected, error
    if damage not in ("truncated", "longer"):
        assert not any(bytes(bounce))
