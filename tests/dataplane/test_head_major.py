"""Head-major records: the slices of a row interleaved piece by piece, and back."""

import numpy as np

from kvtier.dataplane.head_major import deinterleave, interleave

UNITS, PART = 3, 4  # three pieces (layers x blocks) of 4 bytes per head


def rank_part(heads: list[int]) -> bytes:
    """A worker part holding ``heads``: each piece is its heads one after another."""
    return b"".join(bytes([16 * unit + head]) * PART for unit in range(UNITS) for head in heads)


def test_the_record_is_every_head_of_each_piece_in_head_order():
    row = rank_part([0, 1]) + rank_part([2, 3]) + b"pad"
    record = bytearray(2 * 2 * UNITS * PART)
    interleave(memoryview(row), memoryview(record), 2 * UNITS * PART, UNITS, [0, 1])
    assert bytes(record) == rank_part([0, 1, 2, 3]), "what one worker holding four heads holds"


def test_a_record_deinterleaves_into_every_rank_that_holds_a_slice():
    # Four ranks of a two-head model: ranks 0-1 hold head 0, ranks 2-3 head 1.
    record = rank_part([0, 1])
    row = bytearray(4 * UNITS * PART)
    deinterleave(memoryview(record), memoryview(row), UNITS * PART, UNITS, [0, 0, 1, 1], 2)
    assert bytes(row) == rank_part([0]) * 2 + rank_part([1]) * 2


def test_interleave_then_deinterleave_restores_the_row():
    rng = np.random.default_rng(5)
    segment = UNITS * PART * 2
    row = bytearray(rng.integers(0, 256, 4 * segment, dtype=np.uint8).tobytes())
    record = bytearray(4 * segment)
    interleave(memoryview(row), memoryview(record), segment, UNITS, [0, 1, 2, 3])
    back = bytearray(len(row))
    deinterleave(memoryview(record), memoryview(back), segment, UNITS, [0, 1, 2, 3], 4)
    assert back == row
