"""The native record reader serves records the page cache holds whole from it, others O_DIRECT.

What the page cache holds is asked of the kernel (``native.resident``, the probe the reader
itself uses) rather than assumed from what was done to the file: ``POSIX_FADV_DONTNEED`` may
leave pages that something else holds. Each behaviour runs with cachestat and with the mincore
fallback (forced, so it is tested on every kernel). That a copy from the page cache is faster
than an O_DIRECT read is measured by ``python -m benchmarks disk-read --page-cache warm``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from kvtier import native
from kvtier.format.record import HEADER_BYTES
from kvtier.store import NativeRecordReader, RecordReader
from tests.support.record_files import drop_pages, header_of, write_buffered
from tests.support.store import aligned_buffer

PAYLOAD = 16 * 4096

pytestmark = pytest.mark.skipif(
    native.record_reader() is None, reason="kvtier.native._recordread is not built"
)


@pytest.fixture(params=["cachestat", "mincore"])
def probe(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test once per way of asking the kernel; mincore forced through the module's seam."""
    from kvtier.native import _recordread  # type: ignore[attr-defined]

    if request.param == "cachestat" and native.residency_probe() != "cachestat":
        pytest.skip("this kernel has no cachestat (Linux < 6.5): only mincore can run")
    _recordread.force_mincore(request.param == "mincore")
    try:
        assert native.residency_probe() == request.param
        yield request.param
    finally:
        _recordread.force_mincore(False)


def read_buffered(path: Path, length: int) -> None:
    """Bring the file's first ``length`` bytes into the page cache, with no read-ahead."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        assert len(os.pread(fd, length, 0)) == length
    finally:
        os.close(fd)


@pytest.fixture
def record(folder: Path) -> tuple[Path, bytes]:
    path = folder / "r.kvb"
    payload = random.Random(11).randbytes(PAYLOAD)
    write_buffered(path, payload)
    return path, payload


def read(io: RecordReader, path: Path, payload: bytes) -> bool:
    """Read the record into a page-aligned row, check bytes and checksum; whether it came from
    the page cache."""
    out = aligned_buffer(PAYLOAD)
    header, checksum, from_page_cache = io.read_checked(path, out, checksum=True)
    assert bytes(out) == payload
    assert bytes(header) == header_of(payload)
    assert checksum == xxhash.xxh3_64_intdigest(payload)
    return from_page_cache


def test_a_record_the_page_cache_holds_is_read_from_it(
    record: tuple[Path, bytes], probe: str
) -> None:
    path, payload = record
    assert native.resident(path), "a record just written buffered and fsynced is cached"
    assert read(NativeRecordReader(), path, payload)


def test_a_record_dropped_from_the_page_cache_is_read_o_direct(
    record: tuple[Path, bytes], probe: str
) -> None:
    path, payload = record
    drop_pages(path)
    if native.resident(path):
        pytest.skip("the kernel kept the record's pages after POSIX_FADV_DONTNEED")
    assert not read(NativeRecordReader(), path, payload)
    assert not native.resident(path), "an O_DIRECT read leaves nothing in the page cache"


@pytest.mark.parametrize("cached_bytes", [HEADER_BYTES, HEADER_BYTES + PAYLOAD - 4096])
def test_a_record_partly_cached_is_read_o_direct(
    record: tuple[Path, bytes], probe: str, cached_bytes: int
) -> None:
    """The header's page alone, or every page but the last: either way not the whole file."""
    path, payload = record
    drop_pages(path)
    if native.resident(path):
        pytest.skip("the kernel kept the record's pages after POSIX_FADV_DONTNEED")
    read_buffered(path, cached_bytes)
    assert not native.resident(path)
    assert not read(NativeRecordReader(), path, payload)


def test_with_page_cache_reads_off_a_held_record_is_read_o_direct(
    record: tuple[Path, bytes], probe: str
) -> None:
    path, payload = record
    assert native.resident(path)
    assert not read(NativeRecordReader(page_cache_reads=False), path, payload)


def test_the_python_steps_never_report_the_page_cache(record: tuple[Path, bytes]) -> None:
    path, payload = record
    io = RecordReader()
    out = aligned_buffer(PAYLOAD)
    assert io.read_checked(path, out, checksum=True)[2] is False
    assert bytes(out) == payload


def test_resident_reads_nothing_into_the_page_cache(record: tuple[Path, bytes], probe: str) -> None:
    path, _ = record
    drop_pages(path)
    if native.resident(path):
        pytest.skip("the kernel kept the record's pages after POSIX_FADV_DONTNEED")
    assert not native.resident(path), "asking twice must not have faulted pages in"


def test_resident_of_a_missing_file_raises_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="absent"):
        native.resident(tmp_path / "absent")
