"""The record header: round trip, and one failing check per reason."""

from __future__ import annotations

import struct
import zlib

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import CorruptRecordError
from kvtier.format import (
    HEADER_BYTES,
    MAX_KEY_BYTES,
    RecordHeader,
    compute_checksum,
    decode_header,
    encode_header,
    make_header,
    verify_payload,
)
from kvtier.format.checksum import CRC32, XXH3_64

NS = bytes(range(16))
KEY = bytes(32) + (3).to_bytes(4, "big")

headers = st.builds(
    RecordHeader,
    namespace_digest=st.binary(min_size=16, max_size=16),
    key=st.binary(min_size=1, max_size=MAX_KEY_BYTES),
    payload_len=st.integers(0, 2**64 - 1),
    payload_checksum=st.integers(0, 2**64 - 1),
    checksum_alg=st.sampled_from([XXH3_64.algorithm_id, CRC32.algorithm_id]),
)


@given(headers)
def test_decode_of_encode_is_identity(header: RecordHeader) -> None:
    encoded = encode_header(header)
    assert len(encoded) == HEADER_BYTES
    assert decode_header(encoded, header.namespace_digest, header.key, header.payload_len) == header


def reason_of(buf: bytes, namespace: bytes = NS, key: bytes = KEY, length: int | None = 10) -> str:
    with pytest.raises(CorruptRecordError) as info:
        decode_header(buf, namespace, key, length)
    return info.value.reason


def good() -> bytearray:
    return bytearray(encode_header(make_header(NS, KEY, b"0123456789")))


def test_zero_filled_header_is_bad_magic() -> None:
    assert reason_of(bytes(HEADER_BYTES)) == "bad_magic"


def test_unknown_version_is_version() -> None:
    buf = good()
    struct.pack_into("<H", buf, 8, 99)
    assert reason_of(bytes(buf)) == "version"


@pytest.mark.parametrize("offset", [14, 20, 35, 45, 50, 48 + 36 + 2, 4095])
def test_any_flipped_header_bit_is_caught(offset: int) -> None:
    buf = good()
    buf[offset] ^= 0x01
    assert reason_of(bytes(buf)) == "header_checksum"


def test_unknown_checksum_algorithm_is_version() -> None:
    buf = good()
    buf[12] = 99
    body = 48 + len(KEY)
    struct.pack_into("<Q", buf, body, xxhash.xxh3_64_intdigest(bytes(buf[:body])))
    assert reason_of(bytes(buf)) == "version"


def test_other_namespace_is_namespace() -> None:
    assert reason_of(bytes(good()), namespace=bytes(16)) == "namespace"


def test_other_key_is_key() -> None:
    assert reason_of(bytes(good()), key=b"other") == "key"


def test_other_payload_length_is_length() -> None:
    assert reason_of(bytes(good()), length=11) == "length"


def test_short_buffer_is_length() -> None:
    assert reason_of(bytes(good())[:100]) == "length"


def test_payload_that_does_not_match_is_checksum() -> None:
    header = make_header(NS, KEY, b"0123456789")
    verify_payload(header, b"0123456789")
    with pytest.raises(CorruptRecordError) as info:
        verify_payload(header, b"0123456788")
    assert info.value.reason == "checksum"


def test_checksums_match_their_reference_implementations() -> None:
    data = memoryview(bytearray(b"kv" * 5000))
    assert compute_checksum(data, XXH3_64.algorithm_id) == xxhash.xxh3_64_intdigest(b"kv" * 5000)
    assert compute_checksum(data, CRC32.algorithm_id) == zlib.crc32(b"kv" * 5000)


@pytest.mark.parametrize("key", [b"", bytes(MAX_KEY_BYTES + 1)])
def test_header_refuses_keys_out_of_range(key: bytes) -> None:
    with pytest.raises(ValueError, match="key must be"):
        make_header(NS, key, b"")


def test_header_refuses_digest_of_wrong_size() -> None:
    with pytest.raises(ValueError, match=r"use Namespace\.digest"):
        make_header(bytes(32), KEY, b"")
