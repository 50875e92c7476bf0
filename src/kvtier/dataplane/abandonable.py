"""Loads that may be abandoned at a deadline without ever writing a byte afterwards.

A tier's load writes one block into a host-pool row. When a load overruns its deadline the
tier reports it failed, and vLLM reuses the row for another block at once. A read still
stuck in the kernel (a stalled disk, a hung server) that later completed straight into that
row would overwrite someone else's KV: a wrong byte served. So an abandonable load reads into
a private buffer of its thread and copies into the row only after claiming it:

    PENDING --claim (I/O thread)--> COPYING --written--> WRITTEN --finish--> DONE
    PENDING or WRITTEN --abandon (scheduler)--> ABANDONED   (the late read is dropped)
    COPYING or WRITTEN --release (I/O thread, its read failed)--> PENDING   (another source
                                                                             may claim)

``abandon`` fails while a copy is under way (a memcpy of one row: it ends in microseconds to
milliseconds); the caller asks again at its next step. A store moves a load to WRITTEN as soon
as it stops writing the row (``written``; ``finish`` from COPYING says the same), so a thread
that loads several blocks in turn never holds one it is done with out of the scheduler's
reach while it reads the next: a WRITTEN load abandoned at the deadline is reported failed
and its row freed, unread. The private copy costs one memcpy per
block (docs/benchmarks.md); it buys the guarantee above.

A store may claim before reading when its read cannot wait: the disk store reads a record the
page cache holds straight into the claimed row with ``RWF_NOWAIT`` (``DiskStore.get_into_when``),
so COPYING still lasts no longer than a copy. The native reader makes its claims itself, in the
same call as the read (after it, for a read into the bounce buffer). If that read fails the row
is left partly written and the load reports failure; vLLM frees a failed load's row without
reading it.
"""

from __future__ import annotations

import enum
import mmap
import threading
from collections.abc import Callable

from kvtier import native
from kvtier.buffers import address_of, copy_into


class LoadState(enum.Enum):
    PENDING = "pending"
    COPYING = "copying"
    DONE = "done"
    ABANDONED = "abandoned"
    WRITTEN = "written"


#: The states in the order of their numbers in a claim cell (kvtier/native/recordread.h).
_STATES = (
    LoadState.PENDING,
    LoadState.COPYING,
    LoadState.DONE,
    LoadState.ABANDONED,
    LoadState.WRITTEN,
)
_NUMBER = {state: number for number, state in enumerate(_STATES)}
_CLAIM_OPS = native.claim_ops()
#: Where the native reader is not built nothing but Python moves a cell: a lock serves.
_FALLBACK_LOCK = threading.Lock()


class AbandonableLoad:
    """One block's load into one destination row (see the module docstring).

    A ``kvtier.store.base.LoadClaim``: a store's ``get_into_when`` takes it as its ``claim``. Its
    state lives in ``native_cell``, a 4-byte cell moved only by compare-and-swap, so the disk
    store's native reader claims the row inside its read call (one GIL hand-over per block
    instead of two) while the scheduler may abandon it.
    """

    __slots__ = ("native_cell",)

    def __init__(self) -> None:
        self.native_cell = bytearray(4)  # zero: PENDING

    @property
    def state(self) -> LoadState:
        if _CLAIM_OPS is not None:
            return _STATES[_CLAIM_OPS[1](self.native_cell)]
        return _STATES[self.native_cell[0]]

    def _move(self, from_state: LoadState, to_state: LoadState) -> bool:
        if _CLAIM_OPS is not None:
            return _CLAIM_OPS[0](self.native_cell, _NUMBER[from_state], _NUMBER[to_state])
        with _FALLBACK_LOCK:
            if self.native_cell[0] != _NUMBER[from_state]:
                return False
            self.native_cell[0] = _NUMBER[to_state]
            return True

    def claim(self) -> bool:
        """I/O thread, data in hand: True if it may now copy into the row."""
        return self._move(LoadState.PENDING, LoadState.COPYING)

    def written(self) -> None:
        """I/O thread: the row will not be written again (a no-op unless copying)."""
        self._move(LoadState.COPYING, LoadState.WRITTEN)

    def finish(self) -> None:
        if not self._move(LoadState.WRITTEN, LoadState.DONE):
            self._move(LoadState.COPYING, LoadState.DONE)

    def release(self) -> bool:
        """I/O thread: give back a claim whose read failed, so that another source may claim
        the row later (a no-op unless copying or written); True: this load's claims can
        always be given back. The row may hold part of the failed read; it is not written
        again unless claimed again, and a load abandoned meanwhile is freed unread like any
        failed one."""
        if not self._move(LoadState.WRITTEN, LoadState.PENDING):
            self._move(LoadState.COPYING, LoadState.PENDING)
        return True

    def abandon(self) -> bool:
        """Scheduler: True if the load will never touch its row again; False while it is
        copying (ask again later) or when it already finished."""
        if self._move(LoadState.PENDING, LoadState.ABANDONED):
            return True
        if self._move(LoadState.WRITTEN, LoadState.ABANDONED):
            return True
        return self.state is LoadState.ABANDONED

    @property
    def abandoned(self) -> bool:
        """True once abandoned: whatever its row holds is not this load's to report."""
        return self.state is LoadState.ABANDONED


#: Huge-page size on x86-64 and arm64 (4 KiB base pages): where bounce buffers are aligned.
HUGE_PAGE = 2 << 20


class BounceBuffers:
    """One page-aligned buffer of ``nbytes`` per thread (aligned, so O_DIRECT reads work).

    Each buffer starts on a huge-page boundary and asks for huge pages (``MADV_HUGEPAGE``,
    which the kernel honours unless transparent huge pages are off). Why: an ``O_DIRECT`` read
    hands the device one segment per physically contiguous run of the buffer, and a 4 MiB
    buffer of scattered 4 KiB pages needs more segments than a request may carry (254 on
    virtio), so the read is split into several requests and runs well below the disk's speed
    (docs/bench/2026-12-04-resident-read-one-pass.md).
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._local = threading.local()

    def get(self) -> memoryview:
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            size = max(mmap.PAGESIZE, -(-self.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
            # Mapped one huge page longer, so an aligned start always fits; the slack is never
            # touched and so never backed by memory.
            mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            start = -address_of(mapping) % HUGE_PAGE
            if hasattr(mmap, "MADV_HUGEPAGE"):
                mapping.madvise(mmap.MADV_HUGEPAGE, start, size)
            self._local.mapping = mapping
            buffer = memoryview(mapping)[start : start + self.nbytes]
            self._local.buffer = buffer
        return buffer


def load_abandonably(
    load: AbandonableLoad,
    read_into: Callable[[memoryview], bool],
    bounce: memoryview,
    row: memoryview,
) -> bool:
    """Read with ``read_into`` into ``bounce``; copy into ``row`` only if ``load`` is claimed.

    Returns True when ``row`` holds the verified data; False on a miss or when the load was
    abandoned (then ``row`` was never touched).
    """
    if not read_into(bounce):
        return False
    if not load.claim():
        return False
    try:
        copy_into(row, bounce)
    finally:
        load.finish()
    return True
