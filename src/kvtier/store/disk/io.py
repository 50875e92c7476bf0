"""File I/O primitives of the disk store: page alignment, whole-buffer positional I/O, folder
fsync and the I/O threads' priority. Records are written by ``kvtier.store.disk.writer`` and
read by ``kvtier.store.disk.reader``; ``kvtier.store.disk.record_io.RecordIO`` pairs the two.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtier.buffers import address_of
from kvtier.format.checksum import Buffer

_PAGE = mmap.PAGESIZE


def aligned(buf: memoryview) -> bool:
    """True if ``buf`` starts on a page and spans whole pages (what O_DIRECT needs here)."""
    if buf.readonly or not buf.c_contiguous or not buf.nbytes or buf.nbytes % _PAGE:
        return False
    return address_of(buf) % _PAGE == 0


def full_io(
    op: Callable[[int, Sequence[memoryview], int], int],
    fd: int,
    buffers: Sequence[Buffer],
    expect_all: bool = False,
) -> int:
    """Run ``preadv``/``pwritev`` from offset 0 until every buffer is done or EOF; bytes moved."""
    views = [memoryview(b).cast("B") for b in buffers]
    done = 0
    while views:
        n = op(fd, views, done)
        if n == 0:
            if expect_all:
                raise OSError(errno.EIO, "write made no progress")
            break
        done += n
        while views and n >= views[0].nbytes:
            n -= views.pop(0).nbytes
        if n:
            views[0] = views[0][n:]
    return done


def fsync_dir(path: Path) -> None:
    """fsync a folder so a rename or unlink in it survives a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_CLASS_BE = 2
_IOPRIO_CLASS_IDLE = 3


def set_background_io_priority(idle: bool = False) -> bool:
    """Lower the calling thread's disk I/O priority (Linux ``ioprio_set``).

    Best-effort level 7 (lowest) by default; ``idle=True`` picks the idle class, served only
    when nobody else wants the disk (can starve). Affects only the calling thread, so call it
    at the start of each tier I/O thread. Returns False where unsupported (not Linux, unknown
    architecture, syscall refused); never raises.
    """
    number = _IOPRIO_SET.get(platform.machine())
    if platform.system() != "Linux" or number is None:
        return False
    cls, level = (_IOPRIO_CLASS_IDLE, 0) if idle else (_IOPRIO_CLASS_BE, 7)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.syscall(number, _IOPRIO_WHO_PROCESS, 0, (cls << _IOPRIO_CLASS_SHIFT) | level)
    except (OSError, AttributeError):
        return False
    return result == 0
