"""The native record reader (kvtier.native._recordread) against the Python read path.

Both readers (``RecordReader`` and ``NativeRecordReader``) must accept the same files and refuse the
same ones with the same reasons; the native XXH3-64 must equal the xxhash package's. The reader's
point (one GIL hand-over per block) is measured by ``python -m benchmarks disk-read``, not here.
"""

from __future__ import annotations

import errno
import os
import platform
import random
import shutil
from pathlib import Path

import pytest
import xxhash

from kvtier import native
from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format.checksum import CRC32
from kvtier.format.record import HEADER_BYTES
from kvtier.store import NativeRecordReader, RecordReader, default_reader
from tests.support.record_files import DAMAGES, write_record
from tests.support.store import aligned_buffer

BUILDABLE = platform.system() == "Linux" and bool(
    os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
)
PAYLOAD = 3 * 4096
NATIVE = native.record_reader() is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="kvtier.native._recordread is not built")


@pytest.mark.skipif(not BUILDABLE, reason="no C compiler or not Linux: nothing to build here")
def test_the_reader_is_built_in_a_clone_with_a_compiler() -> None:
    assert native.record_reader.__wrapped__() is not None, (
        "kvtier.native._recordread is not built: run `bash scripts/setup.sh` "
        "(python setup.py build_ext --inplace) in this clone"
    )


@needs_native
def test_native_xxh3_equals_the_xxhash_package_at_every_length() -> None:
    from kvtier.native import _recordread  # type: ignore[attr-defined]

    rng = random.Random(7)
    data = rng.randbytes(3 << 20)
    lengths = [*range(241, 2200), 4096, 65536, 2 << 20, len(data)]
    lengths += [rng.randrange(241, len(data)) for _ in range(200)]
    for n in lengths:
        view = memoryview(data)[:n]
        assert _recordread.xxh3_64(view) == xxhash.xxh3_64_intdigest(view), f"{n} bytes"
    with pytest.raises(ValueError, match="at least 241"):
        _recordread.xxh3_64(b"x" * 240)


def payload_of(seed: int) -> bytes:
    return random.Random(seed).randbytes(PAYLOAD)


def record_io(native_reads: bool) -> RecordReader:
    reader = NativeRecordReader() if native_reads else RecordReader()
    assert reader.native is native_reads
    return reader


BOTH = [pytest.param(False, id="python"), pytest.param(True, id="native", marks=needs_native)]


@pytest.mark.parametrize("native_reads", BOTH)
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_a_good_record_reads_whole_with_its_checksum(
    tmp_path: Path, native_reads: bool, aligned: bool
) -> None:
    path = tmp_path / "r.kvb"
    payload = payload_of(1)
    write_record(path, payload)
    io = record_io(native_reads)
    out = aligned_buffer(PAYLOAD) if aligned else memoryview(bytearray(PAYLOAD + 1))[1:]
    header, checksum, _ = io.read_checked(path, out, checksum=True)
    assert bytes(out) == payload
    assert bytes(header) == path.read_bytes()[:HEADER_BYTES]
    assert checksum == (xxhash.xxh3_64_intdigest(payload) if native_reads else None)
    _, unasked, _ = io.read_checked(path, out, checksum=False)
    assert unasked is None


@pytest.mark.parametrize("native_reads", BOTH)
def test_a_crc32_record_leaves_the_checksum_to_the_caller(tmp_path: Path, native_reads: bool):
    path = tmp_path / "r.kvb"
    write_record(path, payload_of(2), CRC32.algorithm_id)
    _, checksum, _ = record_io(native_reads).read_checked(
        path, aligned_buffer(PAYLOAD), checksum=True
    )
    assert checksum is None


@pytest.mark.parametrize("native_reads", BOTH)
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_both_paths_refuse_each_damaged_file_alike(
    tmp_path: Path, native_reads: bool, damage: str
) -> None:
    apply, expected = DAMAGES[damage]
    if damage == "other-user" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    path = tmp_path / "r.kvb"
    write_record(path, payload_of(3))
    apply(path)
    out = aligned_buffer(PAYLOAD)
    with pytest.raises((CorruptRecordError, OSError)) as caught:
        record_io(native_reads).read_checked(path, out, checksum=True)
    error = caught.value
    if isinstance(expected, str):
        assert isinstance(error, CorruptRecordError) and error.reason == expected, error
    else:
        assert isinstance(error, OSError) and error.errno == expected, error
        assert str(path) in str(error)
    if damage not in ("truncated", "longer"):
        assert not any(bytes(out)), "nothing is read from a file that cannot be a record"


@needs_native
def test_a_planted_fifo_leaves_direct_reads_on(tmp_path: Path) -> None:
    """A FIFO refuses O_DIRECT with EINVAL as a file system without O_DIRECT does; only the
    latter may turn direct reads off."""
    io = record_io(True)
    good, fifo = tmp_path / "good.kvb", tmp_path / "fifo.kvb"
    write_record(good, payload_of(4))
    os.mkfifo(fifo, 0o600)
    with pytest.raises(CorruptRecordError, match="mode"):
        io.read_checked(fifo, aligned_buffer(PAYLOAD), checksum=True)
    assert io.direct_reads


def test_the_default_reader_is_the_native_one_where_it_is_built() -> None:
    assert isinstance(default_reader(), NativeRecordReader) is NATIVE
    assert default_reader().native is NATIVE


@needs_native
def test_a_reader_overriding_a_python_step_stays_native() -> None:
    """Nothing switches a reader's path behind its back: a test that faults the native reader
    says so by its class, and its plain loads still take the one-call read."""

    class Faulty(NativeRecordReader):
        def open_for_read(self, path: Path, direct: bool) -> int:
            raise OSError(errno.EIO, "injected")

    assert Faulty().native
    assert not RecordReader().native


def test_the_native_reader_is_refused_where_it_is_not_built(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(native, "record_reader", lambda: None)
    with pytest.raises(ConfigError, match="native record reader is not built"):
        NativeRecordReader()
    assert type(default_reader()) is RecordReader
