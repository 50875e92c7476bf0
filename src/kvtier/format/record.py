"""The on-disk block record: a 4096-byte header, then the payload.

Layout (little-endian)::

    offset  size  field
    0       8     magic            b"KVTIERB1"
    8       2     version          FORMAT_VERSION
    10      2     header_len       HEADER_BYTES (4096)
    12      1     checksum_alg     id from kvtier.format.checksum
    13      1     flags            bit 0: SEALED (payload encrypted); other bits 0
    14      2     key_len          1..MAX_KEY_BYTES
    16      16    namespace        Namespace.digest()
    32      8     payload_len      bytes after the header
    40      8     payload_checksum checksum of the payload with checksum_alg
    48      K     key              opaque key bytes (vLLM: 32-byte block hash + u32 group, BE)
    48+K    S     seal             only when SEALED (S = 52, else 0): key id (8), record
                                   salt (16), GCM nonce (12), GCM tag (16); kvtier.format.sealing
    48+K+S  8     header_checksum  xxh3_64 of bytes [0, 48+K+S)
    56+K+S  ...   zero padding up to header_len

A sealed record's ``key`` is its stored name (a keyed MAC of the block key, never the block key
itself) and its payload is ciphertext of the same length as the KV, so the payload still
starts page-aligned. ``payload_checksum`` covers the bytes as stored (the ciphertext): a
checksum of the plaintext would be a keyless fingerprint of the KV, letting whoever can compute
the KV of a guessed prompt find it in a folder, and a checksum of what is stored lets
``verify`` find bit rot without the key. The seal sits before the header checksum, so a reader
that does not know the flag fails the record as ``header_checksum``.

The header fills one page so the payload starts page-aligned: a reader can ``preadv`` the
file straight into a page-aligned host-pool row, with ``O_DIRECT`` where the buffer allows.
The header checksum is always xxh3-64 so it can be checked before the algorithm id is trusted.

``decode_header`` checks, in this order, and raises ``CorruptRecordError`` with the reason:
``bad_magic`` (also a zero-filled file), ``version`` (unknown version, header length, flag or
checksum id), ``header_checksum`` (damaged header or non-zero padding), ``namespace``,
``key``, ``length``. The payload checksum is checked by ``verify_payload`` (``checksum``)
once the payload is in the caller's buffer; ``verify_payload`` refuses a sealed record
(``sealed``: only its key can open it, kvtier.format.sealing).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from kvtier.errors import CorruptRecordError
from kvtier.format import checksum as _checksum

MAGIC = b"KVTIERB1"
#: Bumped whenever the header layout or its meaning changes; readers refuse other values.
FORMAT_VERSION = 1
#: Header size on disk; the payload starts at this offset.
HEADER_BYTES = 4096
#: Bytes of the namespace digest stored in each header.
NAMESPACE_DIGEST_BYTES = 16
#: Longest key a record can carry (vLLM's keys are 36 bytes).
MAX_KEY_BYTES = 256
#: Header flag: the payload is AES-256-GCM ciphertext and the header carries a ``Seal``.
FLAG_SEALED = 0x01
_KNOWN_FLAGS = FLAG_SEALED
KEY_ID_BYTES = 8
SALT_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16

_FIXED = struct.Struct(f"<8sHHBBH{NAMESPACE_DIGEST_BYTES}sQQ")
_U64 = struct.Struct("<Q")
_SEAL = struct.Struct(f"<{KEY_ID_BYTES}s{SALT_BYTES}s{NONCE_BYTES}s{TAG_BYTES}s")
_ZERO_PAGE = bytes(HEADER_BYTES)


@dataclass(frozen=True, slots=True)
class Seal:
    """What a sealed record's header carries to open it (kvtier.format.sealing)."""

    #: Identifier of the master key the record was written under (not secret).
    key_id: bytes
    #: Random per-record salt the record's AES key is derived with.
    salt: bytes
    #: Random GCM nonce.
    nonce: bytes
    #: GCM authentication tag over the ciphertext and the associated data.
    tag: bytes

    def __post_init__(self) -> None:
        sizes = (KEY_ID_BYTES, SALT_BYTES, NONCE_BYTES, TAG_BYTES)
        values = (self.key_id, self.salt, self.nonce, self.tag)
        if any(not isinstance(v, bytes) or len(v) != n for v, n in zip(values, sizes, strict=True)):
            raise ValueError(f"seal fields must be bytes of {sizes} bytes")


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """The decoded header of one record; ``decode_header(encode_header(h)) == h``."""

    #: Digest of the namespace the record was written for (NAMESPACE_DIGEST_BYTES long).
    namespace_digest: bytes
    #: The block key, opaque bytes, 1..MAX_KEY_BYTES long.
    key: bytes
    #: Bytes of payload that follow the header.
    payload_len: int
    #: Checksum of the payload, computed with ``checksum_alg``.
    payload_checksum: int
    #: Id of the payload checksum algorithm (kvtier.format.checksum.ALGORITHMS).
    checksum_alg: int = _checksum.DEFAULT_ALGORITHM.algorithm_id
    #: Format version the record was written with.
    version: int = FORMAT_VERSION
    #: Present when the payload is encrypted (flag SEALED); None for a plain record.
    seal: Seal | None = None

    @property
    def flags(self) -> int:
        """The header's flags byte."""
        return FLAG_SEALED if self.seal is not None else 0

    def __post_init__(self) -> None:
        if len(self.namespace_digest) != NAMESPACE_DIGEST_BYTES:
            raise ValueError(
                f"namespace_digest is {len(self.namespace_digest)} bytes; "
                f"use Namespace.digest() ({NAMESPACE_DIGEST_BYTES} bytes)"
            )
        check_key(self.key)
        if not 0 <= self.payload_len < 2**64 or not 0 <= self.payload_checksum < 2**64:
            raise ValueError("payload_len and payload_checksum must fit in an unsigned 64-bit int")

    @property
    def record_bytes(self) -> int:
        """Size of the whole record file: header plus payload."""
        return HEADER_BYTES + self.payload_len


def check_key(key: bytes) -> None:
    """Raise ``ValueError`` unless ``key`` is bytes of 1..MAX_KEY_BYTES (a caller's bug)."""
    if not isinstance(key, bytes) or not 1 <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"a key must be 1..{MAX_KEY_BYTES} bytes, got {key!r:.80}")


def make_header(
    namespace_digest: bytes,
    key: bytes,
    payload: _checksum.Buffer,
    checksum_alg: int = _checksum.DEFAULT_ALGORITHM.algorithm_id,
    payload_checksum: int | None = None,
) -> RecordHeader:
    """Build the header for ``payload`` (checksummed in place, not copied; or
    ``payload_checksum``, its checksum under ``checksum_alg`` computed already)."""
    payload_view = memoryview(payload)
    if payload_checksum is None:
        payload_checksum = _checksum.compute_checksum(payload_view, checksum_alg)
    return RecordHeader(
        namespace_digest=namespace_digest,
        key=key,
        payload_len=payload_view.nbytes,
        payload_checksum=payload_checksum,
        checksum_alg=checksum_alg,
    )


def encode_header(header: RecordHeader) -> bytes:
    """Serialise ``header`` to exactly HEADER_BYTES bytes."""
    fixed = _FIXED.pack(
        MAGIC,
        header.version,
        HEADER_BYTES,
        header.checksum_alg,
        header.flags,
        len(header.key),
        header.namespace_digest,
        header.payload_len,
        header.payload_checksum,
    )
    body = fixed + header.key
    if header.seal is not None:
        seal = header.seal
        body += _SEAL.pack(seal.key_id, seal.salt, seal.nonce, seal.tag)
    body += _U64.pack(xxhash.xxh3_64_intdigest(body))
    return body + _ZERO_PAGE[len(body) :]


def decode_header(
    buf: _checksum.Buffer,
    expected_namespace: bytes,
    expected_key: bytes,
    expected_payload_len: int | None = None,
) -> RecordHeader:
    """Parse and check a header read from disk.

    ``buf`` holds at least HEADER_BYTES bytes (only those are read). The header must
    belong to ``expected_namespace`` and ``expected_key`` and, when given, announce
    ``expected_payload_len`` bytes of payload. Raises ``CorruptRecordError`` with the first
    failing check's reason (see the module docstring); never returns a header it has not
    fully checked.
    """
    view = memoryview(buf).cast("B")
    if view.nbytes < HEADER_BYTES:
        raise CorruptRecordError("length", f"header is {view.nbytes} bytes, need {HEADER_BYTES}")
    magic, version, header_len, alg, flags, key_len, namespace, payload_len, payload_ck = (
        _FIXED.unpack_from(view)
    )
    if magic != MAGIC:
        raise CorruptRecordError("bad_magic", f"magic {bytes(magic)!r}, want {MAGIC!r}")
    if version != FORMAT_VERSION or header_len != HEADER_BYTES:
        raise CorruptRecordError(
            "version", f"version {version}/header {header_len}, want {FORMAT_VERSION}/4096"
        )
    if flags & ~_KNOWN_FLAGS:
        raise CorruptRecordError("version", f"unknown header flags {flags:#04x}")
    seal_len = _SEAL.size if flags & FLAG_SEALED else 0
    body_len = _FIXED.size + key_len + seal_len
    if not 1 <= key_len <= MAX_KEY_BYTES:
        raise CorruptRecordError("header_checksum", f"key length {key_len} out of range")
    (stored_ck,) = _U64.unpack_from(view, body_len)
    if stored_ck != xxhash.xxh3_64_intdigest(view[:body_len]) or (
        # As bytes: comparing memoryviews goes item by item (about 7 us for a header).
        bytes(view[body_len + _U64.size : HEADER_BYTES]) != _ZERO_PAGE[body_len + _U64.size :]
    ):
        raise CorruptRecordError("header_checksum", "header bytes do not match their checksum")
    _checksum.algorithm(alg)
    if namespace != expected_namespace:
        raise CorruptRecordError(
            "namespace", f"record of namespace {namespace.hex()}, want {expected_namespace.hex()}"
        )
    key = bytes(view[_FIXED.size : _FIXED.size + key_len])
    if key != expected_key:
        raise CorruptRecordError("key", f"record of key {key.hex()}, want {expected_key.hex()}")
    if expected_payload_len is not None and payload_len != expected_payload_len:
        raise CorruptRecordError(
            "length", f"payload of {payload_len} bytes, want {expected_payload_len}"
        )
    seal = None
    if seal_len:
        seal = Seal(*_SEAL.unpack_from(view, _FIXED.size + key_len))
    return RecordHeader(namespace, key, payload_len, payload_ck, alg, version, seal)


def verify_payload(
    header: RecordHeader, payload: _checksum.Buffer, xxh3_64: int | None = None
) -> None:
    """Raise ``CorruptRecordError("checksum")`` unless ``payload`` is the plain KV ``header``
    describes; ``CorruptRecordError("sealed")`` for an encrypted record, which only its key
    opens (a reader without one must not serve ciphertext as KV). ``xxh3_64``: the payload's
    XXH3-64, when the reader already computed it (used only if the header names XXH3-64)."""
    if header.seal is not None:
        raise CorruptRecordError(
            "sealed", "the record is encrypted and this reader has no key for it"
        )
    verify_stored_bytes(header, payload, xxh3_64)


def verify_stored_bytes(
    header: RecordHeader, payload: _checksum.Buffer, xxh3_64: int | None = None
) -> None:
    """Raise ``CorruptRecordError`` unless ``payload`` has the length and checksum the header
    says: for a sealed record, the ciphertext's integrity (no proof of who wrote it)."""
    view = memoryview(payload)
    if view.nbytes != header.payload_len:
        raise CorruptRecordError(
            "length", f"payload {view.nbytes} bytes, want {header.payload_len}"
        )
    if xxh3_64 is not None and header.checksum_alg == _checksum.XXH3_64.algorithm_id:
        actual = xxh3_64
    else:
        actual = _checksum.compute_checksum(view, header.checksum_alg)
    if actual != header.payload_checksum:
        raise CorruptRecordError(
            "checksum", f"payload checksum {actual:#x}, header says {header.payload_checksum:#x}"
        )
