"""``copy_into``: the same bytes as a slice assignment, large writable copies through
``ctypes.memmove`` (which releases the GIL), the rest as a slice assignment."""

import ctypes
import mmap

import pytest

from kvtier import buffers
from kvtier.buffers import GIL_FREE_MIN_BYTES, copy_into

BIG = 4 * GIL_FREE_MIN_BYTES


@pytest.fixture
def memmoves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the copies that went through ``ctypes.memmove``."""
    sizes: list[int] = []
    real = ctypes.memmove

    def recording(dst: int, src: int, size: int) -> int:
        sizes.append(size)
        return real(dst, src, size)

    monkeypatch.setattr(buffers.ctypes, "memmove", recording)
    return sizes


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def test_large_writable_copy_goes_through_memmove_and_moves_the_right_bytes(
    memmoves: list[int],
) -> None:
    source = bytearray(pattern(BIG + 8192, 3))
    target = mmap.mmap(-1, BIG + 8192)
    # Slices at offsets: the address taken must be the slice's, not the buffer's start.
    copy_into(memoryview(target)[4096 : 4096 + BIG], memoryview(source)[100 : 100 + BIG])
    assert memmoves == [BIG]
    assert target[:4096] == bytes(4096)
    assert target[4096 : 4096 + BIG] == bytes(source[100 : 100 + BIG])
    assert target[4096 + BIG :] == bytes(4096)


@pytest.mark.parametrize(
    "case", ["small", "readonly source", "non-contiguous"], ids=lambda c: c.replace(" ", "-")
)
def test_other_copies_are_slice_assignments_with_the_same_result(
    memmoves: list[int], case: str
) -> None:
    n = GIL_FREE_MIN_BYTES - 1 if case == "small" else BIG
    data = pattern(2 * n, 5)
    if case == "readonly source":
        source = memoryview(data)[:n]
    elif case == "non-contiguous":
        source = memoryview(bytearray(data))[::2]
    else:
        source = memoryview(bytearray(data))[:n]
    target = memoryview(bytearray(n))
    copy_into(target, source)
    assert memmoves == []
    assert bytes(target) == bytes(source)


def test_sizes_that_differ_are_refused(memmoves: list[int]) -> None:
    with pytest.raises(ValueError, match="copy of 10 bytes into a buffer of 9"):
        copy_into(memoryview(bytearray(9)), memoryview(bytearray(10)))
