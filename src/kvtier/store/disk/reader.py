"""Reading record files: the Python steps (``RecordReader``) and the native one-call reader
(``NativeRecordReader``), one of them chosen explicitly when the store opens.

``default_reader`` takes the native reader where it is built (kvtier.native), else the Python
steps, and says which in its type; nothing switches a reader's path behind its back. A test
that injects a read fault subclasses the reader it means to test: override ``read_checked``
(what both readers answer a plain load with) to fault either; ``read_into`` and
``open_for_read`` are the Python steps' alone.

Choices (figures and the command that produced them in docs/store.md):

* Reads use ``O_DIRECT`` when the caller's buffer is page-aligned. With the CPUs busy, as they
  are in an engine that computes while it restores, ``O_DIRECT`` cold reads were 2.5x faster
  than buffered ones (the data goes straight to the host pool; buffered reads spend CPU on
  read-ahead pages and a copy), and in the engine a fresh process restored 2k tokens in
  0.25 s with ``O_DIRECT`` (vLLM's fs tier) against 0.42 s with buffered reads. With idle CPUs
  the two are within noise. Reading a record does not put it in the page cache; the host pool
  is the RAM tier. Where the file system refuses ``O_DIRECT`` (probed on first use, warned
  once, never failing a block), and for unaligned buffers, buffered reads.
* A record the page cache already holds whole (written buffered where ``O_DIRECT`` writes were
  refused or the payload was unaligned, copied or read by an operator, on a tmpfs-like file
  system) is read buffered: a copy from memory, where ``O_DIRECT`` would fetch it from the
  device again at disk speed. The native reader asks the kernel first, reading nothing
  (``cachestat``, or ``mincore`` before Linux 6.5); any page missing, and the read is
  ``O_DIRECT`` as above. ``read_checked`` says which way each record came, and the disk store
  counts page-cache hits. Only the native reader does this: the Python steps read every
  aligned record ``O_DIRECT``. The native reader's buffered reads go through a per-thread
  staging chunk that the CPU cache holds, hashed and streamed into the row in one pass: on
  4 reader threads that took resident reads from 0.54 to 0.75 of a memcpy
  (docs/benchmarks.md). For a load that must not write its row until claimed,
  ``read_unless_resident`` and ``read_resident`` split that read around the claim, and
  ``read_claiming`` makes both in one call, claiming on the load's claim cell in between.
* With the native reader, a load's read is one C call: open, the checks below, ``preadv``,
  close and the payload's checksum, giving the GIL up once per block. The Python steps give it
  up five times, and each return waits for it while an engine thread runs Python (up to the
  5 ms switch interval): with a busy Python thread beside four readers, the Python steps read
  at 0.13 GB/s where plain ``preadv`` reached 0.49 GB/s (docs/benchmarks.md).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kvtier import native
from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format.record import HEADER_BYTES
from kvtier.store.disk.io import aligned, full_io

log = logging.getLogger(__name__)


class RecordReader:
    """Reads record files with the Python steps (open, checks, ``preadv``), one syscall each;
    override a method to inject a fault. It claims nothing itself: a claimed load's read goes
    through ``bounce`` (``BlockStore.get_into_when``)."""

    #: Whether loads read through the native one-call reader.
    native = False

    def __init__(self, direct_reads: bool = True) -> None:
        """``direct_reads=False`` reads buffered even into page-aligned buffers (for the
        benchmark's and tests' comparisons; keep the default)."""
        self._direct_ok = direct_reads and hasattr(os, "O_DIRECT")
        self._local = threading.local()

    @property
    def direct_reads(self) -> bool:
        """True while reads into page-aligned buffers use ``O_DIRECT``."""
        return self._direct_ok

    def read_into(self, path: Path, out: memoryview) -> memoryview:
        """Read the record at ``path``: payload into ``out``, header into a returned buffer.

        One ``preadv`` fills both. The returned header buffer is reused by the calling
        thread's next read. Raises ``CorruptRecordError`` ("symlink", "not_regular",
        "not_private", "length") for files that cannot be a valid record of ``out``'s size
        written by this user, ``FileNotFoundError`` when the file is gone, ``OSError`` for
        other faults.
        """
        header = self._buffer("read_header")
        direct = self._direct_ok and aligned(out)
        try:
            try:
                fd = self.open_for_read(path, direct)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not direct:
                    raise
                # O_DIRECT refused: by the file system, or because this is no regular file
                # (a FIFO planted in place of a record). Only the first turns it off for good.
                fd = self.open_for_read(path, False)
                direct = False
                if _is_regular(fd):
                    self._disable_direct(exc)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _symlink(path) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _not_regular(path, st.st_mode)
            if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise _not_private(path, st.st_uid, st.st_mode)
            want = HEADER_BYTES + out.nbytes
            if st.st_size != want:
                raise _wrong_size(path, st.st_size, want)
            try:
                got = full_io(os.preadv, fd, [header, out])
            except OSError as exc:
                if exc.errno != errno.EINVAL or not direct:
                    raise
                self._disable_direct(exc)
                got = full_io(os.preadv, fd, [header, out])
            if got != want:
                raise _short_read(path, got, want)
            return header
        finally:
            os.close(fd)

    def read_checked(
        self, path: Path, out: memoryview, checksum: bool
    ) -> tuple[memoryview, int | None, bool]:
        """``read_into``, plus the payload's XXH3-64 when the reader computed it (never, for
        the Python steps: the caller hashes ``out``), and whether the record was copied from
        the page cache (never, here). Raises what ``read_into`` raises, for the same files."""
        return self.read_into(path, out), None, False

    def reads_resident_into(self, out: memoryview) -> bool:
        """True when ``read_unless_resident`` may read a record for ``out`` (never, here)."""
        return False

    def claims_into(self, out: memoryview) -> bool:
        """True when ``read_claiming`` may read a record for ``out`` (never, here)."""
        return False

    def open_for_read(self, path: Path, direct: bool) -> int:
        """Open a record for reading without following links or blocking on a FIFO."""
        # O_NONBLOCK: a FIFO planted in place of a record must not hang the reader.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        return os.open(path, flags | (os.O_DIRECT if direct else 0))

    def _disable_direct(self, exc: OSError) -> None:
        if self._direct_ok:
            log.warning("disk tier: O_DIRECT reads refused (%s); using buffered reads", exc)
        self._direct_ok = False

    def _buffer(self, name: str) -> memoryview:
        """A page-aligned header-sized buffer of this thread (an anonymous mmap)."""
        buf = getattr(self._local, name, None)
        if buf is None:
            buf = memoryview(mmap.mmap(-1, HEADER_BYTES))
            setattr(self._local, name, buf)
        return buf


class NativeRecordReader(RecordReader):
    """Reads record files in one GIL-free call each (kvtier.native), with the page-cache
    probe and the claimed reads; the Python steps only for a buffer the call cannot take
    (read-only or not contiguous)."""

    native = True

    def __init__(self, direct_reads: bool = True, page_cache_reads: bool = True) -> None:
        """``page_cache_reads=False`` reads even records the page cache holds ``O_DIRECT``
        (and so makes no claimed reads). ``ConfigError`` where the native reader is not
        built: choose ``RecordReader`` there, or ``default_reader``."""
        super().__init__(direct_reads)
        reader = native.record_reader()
        if reader is None:
            raise ConfigError(
                "disk tier: the native record reader is not built (kvtier.native); "
                "reinstall kvtier with a C compiler, or read with RecordReader"
            )
        self._reader: Callable[..., Any] = reader
        self._page_cache_reads = page_cache_reads
        self._resident = native.resident_reader() if page_cache_reads else None
        self._claiming = native.claiming_reader() if self._resident is not None else None
        self._claiming_many = native.claiming_batch_reader() if self._claiming is not None else None
        # False once the kernel refused RWF_NOWAIT reads (read_resident): never again asked.
        self._resident_ok = self._resident is not None

    def read_checked(
        self, path: Path, out: memoryview, checksum: bool
    ) -> tuple[memoryview, int | None, bool]:
        """``read_into`` in one call, plus the payload's XXH3-64 when ``checksum`` is asked and
        the header names XXH3-64 (else None: the caller hashes ``out``), and whether the
        record was copied from the page cache: True only for a read that would have been
        ``O_DIRECT`` and was buffered because the page cache held the whole record."""
        if out.readonly or not out.c_contiguous:
            return super().read_checked(path, out, checksum)
        header = self._buffer("read_header")
        direct = self._direct_ok and aligned(out)
        status, error, detail, detail2, refused, payload_checksum, cached = self._reader(
            os.fsencode(path), header, out, direct, checksum, self._page_cache_reads
        )
        if refused:
            self._native_direct_refused()
        _check_read(path, status, error, detail, detail2, HEADER_BYTES + out.nbytes)
        return header, payload_checksum, cached

    def reads_resident_into(self, out: memoryview) -> bool:
        return self._resident_ok and not out.readonly and out.c_contiguous

    def read_unless_resident(
        self, path: Path, bounce: memoryview, checksum: bool
    ) -> int | tuple[memoryview, int | None]:
        """``read_checked`` into ``bounce``, unless the page cache holds the whole record:
        then nothing is read and an open descriptor for ``read_resident`` comes back.

        One GIL-free call either way; makes ``read_into``'s checks and raises what it raises.
        Only when ``reads_resident_into(bounce)``.
        """
        assert self._resident is not None
        header = self._buffer("read_header")
        direct = self._direct_ok and aligned(bounce)
        fd, status, error, detail, detail2, refused, payload_checksum = self._resident[0](
            os.fsencode(path), header, bounce, direct, checksum
        )
        if refused:
            self._native_direct_refused()
        if fd >= 0:
            return fd
        _check_read(path, status, error, detail, detail2, HEADER_BYTES + bounce.nbytes)
        return header, payload_checksum

    def read_resident(
        self, fd: int, path: Path, out: memoryview, checksum: bool
    ) -> tuple[memoryview, int | None] | None:
        """Read the record open on ``fd`` (``read_unless_resident``) into ``out``, never waiting
        for the device: the header, and the payload's XXH3-64 as ``read_checked`` gives it, or None
        when a page left the page cache meanwhile (``out`` is then partly written). Closes
        ``fd``. Raises ``NowaitRefused`` when the kernel refused ``RWF_NOWAIT`` (nothing read),
        ``CorruptRecordError`` for a short read, ``OSError`` for other faults.
        """
        assert self._resident is not None
        header = self._buffer("read_header")
        status, error, detail, nowait_refused, payload_checksum = self._resident[1](
            fd, header, out, checksum
        )
        if nowait_refused:
            self._refuse_nowait()
            raise NowaitRefused(path)
        if status == _READ_NOT_RESIDENT:
            return None
        _check_read(path, status, error, detail, 0, HEADER_BYTES + out.nbytes)
        return header, payload_checksum

    def claims_into(self, out: memoryview) -> bool:
        return self._claiming is not None and self.reads_resident_into(out)

    def read_claiming(
        self, path: Path, bounce: memoryview, out: memoryview, cell: bytearray, checksum: bool
    ) -> ClaimedRead | None:
        """A load's whole read in one GIL-free call, claimed on its claim ``cell``
        (kvtier.dataplane.abandonable): a record the page cache holds is claimed, then read
        into ``out`` (``read_resident``); any other is read into ``bounce`` unclaimed, since
        that read may wait for the device, then claimed and copied into ``out``. Either way
        the caller verifies ``out`` after the claim. None: a page left the page cache during
        the claimed read (``out`` partly written). Raises ``NowaitRefused`` (claimed, nothing
        read) and what ``read_unless_resident`` raises. Only when ``claims_into(out)``.
        """
        assert self._claiming is not None
        header = self._buffer("read_header")
        direct = self._direct_ok and aligned(bounce)
        answer = self._claiming(os.fsencode(path), header, bounce, out, cell, direct, checksum)
        return self._claimed(path, header, bounce, out, answer)

    def read_claiming_many(
        self,
        paths: Sequence[Path],
        bounce: memoryview,
        outs: Sequence[memoryview],
        cells: Sequence[bytearray],
        checksum: bool,
    ) -> list[ClaimedRead | Exception | None]:
        """``read_claiming`` of each record in turn, in one GIL-free call for them all: one GIL
        hand-over for the list, where a call per record makes one each, and each can wait out
        the interpreter's switch interval beside a busy Python thread (an engine's loop). Per
        record, what ``read_claiming`` returns, or the exception it would raise. A load no
        longer pending when its turn comes is not read (``into`` None). The headers stay
        valid until this thread's next read."""
        assert self._claiming_many is not None
        headers = self._headers(len(paths))
        direct = self._direct_ok and aligned(bounce)
        answers = self._claiming_many(
            [os.fsencode(p) for p in paths],
            headers,
            bounce,
            list(outs),
            list(cells),
            direct,
            checksum,
        )
        results: list[ClaimedRead | Exception | None] = []
        for i, (path, out, answer) in enumerate(zip(paths, outs, answers, strict=True)):
            header = headers[i * HEADER_BYTES : (i + 1) * HEADER_BYTES]
            try:
                results.append(self._claimed(path, header, bounce, out, answer))
            except (NowaitRefused, CorruptRecordError, OSError) as exc:
                results.append(exc)
        return results

    def _claimed(
        self,
        path: Path,
        header: memoryview,
        bounce: memoryview,
        out: memoryview,
        answer: tuple[int, int, int, int, int, bool, bool, int | None],
    ) -> ClaimedRead | None:
        """What a ``read_claiming`` call's answer means (see there)."""
        into, status, error, detail, detail2, refused, nowait_refused, payload_checksum = answer
        if refused:
            self._native_direct_refused()
        if nowait_refused:
            self._refuse_nowait()
            raise NowaitRefused(path)
        if into == _INTO_NOTHING:
            return ClaimedRead(None, header, None, False)
        if status == _READ_NOT_RESIDENT:
            return None
        _check_read(path, status, error, detail, detail2, HEADER_BYTES + out.nbytes)
        landed = bounce if into == _INTO_BOUNCE_UNCLAIMED else out
        return ClaimedRead(landed, header, payload_checksum, into == _INTO_OUT)

    def _refuse_nowait(self) -> None:
        if self._resident_ok:
            log.warning(
                "disk tier: the kernel refused RWF_NOWAIT reads; records the page cache holds "
                "are read through a bounce buffer"
            )
        self._resident_ok = False

    def _native_direct_refused(self) -> None:
        """The native reader found O_DIRECT refused on a regular file (it read buffered)."""
        self._disable_direct(OSError(errno.EINVAL, os.strerror(errno.EINVAL)))

    def _headers(self, count: int) -> memoryview:
        """``count`` page-aligned header-sized buffers of this thread, back to back."""
        buf: memoryview | None = getattr(self._local, "headers", None)
        if buf is None or buf.nbytes < count * HEADER_BYTES:
            buf = memoryview(mmap.mmap(-1, max(count, 16) * HEADER_BYTES))
            self._local.headers = buf
        return buf[: count * HEADER_BYTES]


def default_reader(direct_reads: bool = True, page_cache_reads: bool = True) -> RecordReader:
    """The native reader where it is built, else the Python steps."""
    if native.record_reader() is None:
        return RecordReader(direct_reads)
    return NativeRecordReader(direct_reads, page_cache_reads)


# What the native reader reports (kvtier/native/recordread.h); any other status is errno's.
_READ_OK, _READ_SYMLINK, _READ_NOT_REGULAR, _READ_NOT_PRIVATE, _READ_LENGTH = 0, 2, 3, 4, 5
_READ_NOT_RESIDENT = 6
# Where read_claiming put the record (recordread.h: kvtier_claimed_read).
_INTO_OUT, _INTO_NOTHING, _INTO_BOUNCE_UNCLAIMED = 1, 2, 4


class NowaitRefused(Exception):
    """The kernel refused a claimed read's ``RWF_NOWAIT`` (a file system without it, such as
    tmpfs) before reading a byte. The reader goes through the bounce buffer from then on; the
    caller gives the claim back and reads this record that way too."""


class ClaimedRead(NamedTuple):
    """What ``read_claiming`` did. ``into``: ``out`` (claimed and written), ``bounce`` (read
    there, but the load was no longer pending: ``out`` untouched, the bytes still worth
    checking) or None (no longer pending: nothing read). ``header`` and ``payload_checksum``
    as ``read_checked`` gives them; ``from_page_cache``: read from the page cache, not the
    device."""

    into: memoryview | None
    header: memoryview
    payload_checksum: int | None
    from_page_cache: bool


def _check_read(path: Path, status: int, error: int, detail: int, detail2: int, want: int) -> None:
    """Return when a native read read all ``want`` bytes; else raise the Python path's error
    for its status."""
    if status == _READ_OK:
        if detail != want:
            raise _short_read(path, detail, want)
        return
    if status == _READ_SYMLINK:
        raise _symlink(path)
    if status == _READ_NOT_REGULAR:
        raise _not_regular(path, detail)
    if status == _READ_NOT_PRIVATE:
        raise _not_private(path, detail, detail2)
    if status == _READ_LENGTH:
        raise _wrong_size(path, detail, want)
    raise OSError(error, os.strerror(error), str(path))


def _symlink(path: Path) -> CorruptRecordError:
    return CorruptRecordError("symlink", f"{path} is a symlink")


def _not_regular(path: Path, mode: int) -> CorruptRecordError:
    return CorruptRecordError("not_regular", f"{path} mode {mode:#o}")


def _not_private(path: Path, uid: int, mode: int) -> CorruptRecordError:
    # Records are 0600 and ours: another user's file, or one others could have rewritten, may
    # carry a valid checksum over KV it wants served.
    return CorruptRecordError(
        "not_private",
        f"{path} is owned by uid {uid} with mode {stat.S_IMODE(mode):#o}; "
        "records must be this user's, 0600",
    )


def _wrong_size(path: Path, size: int, want: int) -> CorruptRecordError:
    return CorruptRecordError("length", f"{path} is {size} bytes, want {want}")


def _short_read(path: Path, got: int, want: int) -> CorruptRecordError:
    return CorruptRecordError("length", f"{path}: read {got} bytes, want {want}")


def _is_regular(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False
