"""Copying one buffer into another without holding the GIL.

``dst[:] = src`` on memoryviews is a memcpy done while holding the GIL, so I/O threads that
copy verified records into their rows take turns, and stall the engine's own Python threads
(vLLM's scheduler and model loop) for as long as each copy lasts, a fraction of a
millisecond per block, thousands of times for one long prompt. ``ctypes.memmove`` releases
the GIL for the copy. Small copies keep the slice assignment (a foreign call costs more than
it saves there), and so do read-only sources (``ctypes`` needs a writable buffer to take an
address).
"""

from __future__ import annotations

import ctypes

#: Below this many bytes a copy stays a slice assignment.
GIL_FREE_MIN_BYTES = 64 * 1024


def address_of(buffer: object) -> int:
    """The address of a writable buffer's first byte (a memoryview, bytearray or mmap; of the
    slice, for a sliced view)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def copy_into(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` for two buffers of equal size; large writable ones copied GIL-free."""
    if dst.nbytes != src.nbytes:
        raise ValueError(f"copy of {src.nbytes} bytes into a buffer of {dst.nbytes}")
    if (
        dst.nbytes < GIL_FREE_MIN_BYTES
        or src.readonly
        or dst.readonly
        or not (dst.c_contiguous and src.c_contiguous)
    ):
        dst[:] = src
        return
    ctypes.memmove(address_of(dst), address_of(src), dst.nbytes)
