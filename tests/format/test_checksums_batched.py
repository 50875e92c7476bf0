"""``compute_checksums``: a batch's checksums in one native call where the reader is built,
the same values as one ``compute_checksum`` a buffer everywhere."""

from __future__ import annotations

import os

import pytest
import xxhash

from kvtier import native
from kvtier.format import checksum
from kvtier.format.checksum import CRC32, XXH3_64, compute_checksum, compute_checksums

NATIVE = native.xxh3_many() is not None


def buffers() -> list[object]:
    """Payload-like buffers of several lengths and kinds (bytes, a memoryview slice)."""
    block = os.urandom(3 << 20)
    return [block[:241], memoryview(block)[7 : 7 + 4096], block[: 2 << 20], bytearray(block[:9999])]


def test_the_batch_equals_one_checksum_a_buffer() -> None:
    data = buffers()
    assert compute_checksums(data) == [compute_checksum(d) for d in data]
    assert compute_checksums(data, CRC32.algorithm_id) == [
        compute_checksum(d, CRC32.algorithm_id) for d in data
    ]
    assert compute_checksums([]) == []


@pytest.mark.skipif(not NATIVE, reason="the native record reader is not built here")
def test_the_native_batch_is_the_xxhash_package_s_xxh3() -> None:
    many = native.xxh3_many()
    assert many is not None
    data = buffers()
    assert many(data) == [xxhash.xxh3_64_intdigest(d) for d in data]
    with pytest.raises(ValueError, match="at least 241 bytes"):
        many([b"x" * 240])
    with pytest.raises(TypeError):
        many([1])


def test_one_native_call_serves_a_batch_of_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def many(data: list[object]) -> list[int]:
        calls.append(len(data))
        return [xxhash.xxh3_64_intdigest(d) for d in data]  # type: ignore[arg-type]

    monkeypatch.setattr(native, "xxh3_many", lambda: many)
    data = buffers()
    assert compute_checksums(data) == [compute_checksum(d) for d in data]
    assert calls == [len(data)]


def test_short_buffers_other_algorithms_and_no_native_reader_hash_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(data: list[object]) -> list[int]:
        raise AssertionError("the native batch was used")

    monkeypatch.setattr(native, "xxh3_many", lambda: refuse)
    short = [b"a" * 240, os.urandom(4096)]
    assert compute_checksums(short) == [xxhash.xxh3_64_intdigest(d) for d in short]
    long = [os.urandom(4096)]
    assert compute_checksums(long, CRC32.algorithm_id) == [compute_checksum(long[0], 2)]
    monkeypatch.setattr(native, "xxh3_many", lambda: None)
    assert compute_checksums(long) == [compute_checksum(long[0], XXH3_64.algorithm_id)]
    assert checksum.DEFAULT_ALGORITHM is XXH3_64
