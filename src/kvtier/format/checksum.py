"""Payload checksums over a buffer, without copying it.

Every algorithm takes any object with the buffer protocol (``bytes``, ``memoryview``, a
numpy row) and returns an unsigned integer of at most 64 bits, stored in the record header
next to the algorithm's id. Ids are part of the on-disk format: never renumber one.

Why xxh3-64 is the default: it runs at memory speed, several times faster than
``zlib.crc32`` (``python -m benchmarks checksum``; docs/store.md), and it comes with the
``xxhash`` package kvtier already depends on. crc32c (hardware CRC) adds a dependency for no
gain there. The checksum guards against torn writes, bit rot and stray edits, not against
an attacker: that is what the 0700/0600 permissions are for.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

from kvtier import native
from kvtier.errors import CorruptRecordError

#: Anything with the buffer protocol (``collections.abc.Buffer`` once Python 3.12 is the floor).
Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ChecksumAlgorithm:
    """One payload checksum algorithm."""

    #: Stable on-disk id (u8). Never reuse or renumber.
    algorithm_id: int
    #: Short name used in logs, docs and the benchmark.
    name: str
    #: Computes the checksum of a buffer; result fits in 64 bits.
    compute: Callable[[Buffer], int]


XXH3_64 = ChecksumAlgorithm(1, "xxh3_64", xxhash.xxh3_64_intdigest)
CRC32 = ChecksumAlgorithm(2, "crc32", zlib.crc32)

#: Every algorithm a reader understands, by id.
ALGORITHMS: dict[int, ChecksumAlgorithm] = {a.algorithm_id: a for a in (XXH3_64, CRC32)}

#: What new records are written with.
DEFAULT_ALGORITHM = XXH3_64


def algorithm(algorithm_id: int) -> ChecksumAlgorithm:
    """Return the algorithm for ``algorithm_id``.

    Raises ``CorruptRecordError("version")`` for an id this version does not know: a
    record written by a newer kvtier, or a damaged header.
    """
    try:
        return ALGORITHMS[algorithm_id]
    except KeyError:
        raise CorruptRecordError(
            "version", f"unknown checksum algorithm id {algorithm_id}"
        ) from None


def compute_checksum(data: Buffer, algorithm_id: int = DEFAULT_ALGORITHM.algorithm_id) -> int:
    """Checksum ``data`` (read in place, never copied) with the algorithm ``algorithm_id``."""
    return algorithm(algorithm_id).compute(data)


def compute_checksums(
    data: Sequence[Buffer], algorithm_id: int = DEFAULT_ALGORITHM.algorithm_id
) -> list[int]:
    """``compute_checksum`` of each buffer. XXH3-64 of buffers of at least
    ``native.XXH3_MANY_MIN_BYTES`` (every record payload) runs in one native call where it is
    built: the GIL is given up once for the batch instead of once a buffer, and a writing
    thread waits for it once on return instead of once a record while an engine thread runs
    Python (docs/store.md, "What a put costs the engine")."""
    many = native.xxh3_many() if algorithm_id == XXH3_64.algorithm_id else None
    if many is not None and all(memoryview(d).nbytes >= native.XXH3_MANY_MIN_BYTES for d in data):
        return many(data)
    return [compute_checksum(d, algorithm_id) for d in data]
