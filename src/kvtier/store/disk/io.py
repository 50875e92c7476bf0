"""File I/O of the disk store: one replaceable object (``RecordIO``) plus small helpers.

``RecordIO`` is the seam tests use to inject faults (a crash between write and rename, ENOSPC,
a torn write): subclass it and override one method. It holds no state about records.

Choices (figures and the command that produced them in docs/store.md):

* Writes use ``O_DIRECT`` when the payload is page-aligned and a whole number of pages
  (host-pool rows should be): the KV never lands in the page cache, so a burst of offloads
  cannot pile up gigabytes of dirty memory next to the host pool, and a put returns once the
  device has the data. Buffered writes leave every written byte cached even with
  ``posix_fadvise(DONTNEED)`` right after them (the pages are still dirty then, so the
  kernel keeps them); dropping them properly needs an fdatasync first, which multiplies the
  put latency of ``O_DIRECT`` (docs/store.md). Unaligned payloads fall back to buffered
  ``pwritev`` + ``DONTNEED`` (which at least starts write-back at once).
* Reads use ``O_DIRECT`` when the caller's buffer is page-aligned. With the CPUs busy, as they
  are in an engine that computes while it restores, ``O_DIRECT`` cold reads are faster than
  buffered ones (the data goes straight to the host pool; buffered reads spend CPU on
  read-ahead pages and a copy), and so are an engine's fresh-process restores (docs/store.md,
  "Decisions these figures support"). With idle CPUs the two are within noise. Reading a
  record does not put it in the page cache; the host pool is the RAM tier. Where the file
  system refuses ``O_DIRECT`` (probed on first use, warned once, never failing a block), and
  for unaligned buffers, buffered reads.
* A record the page cache already holds whole (written buffered where ``O_DIRECT`` writes were
  refused or the payload was unaligned, copied or read by an operator, on a tmpfs-like file
  system) is read buffered: a copy from memory, where ``O_DIRECT`` would fetch it from the
  device again at disk speed. The native reader asks the kernel first, reading nothing
  (``cachestat``, or ``mincore`` before Linux 6.5); any page missing, and the read is
  ``O_DIRECT`` as above. ``read_checked`` says which way each record came, and the disk store
  counts page-cache hits. Only the native reader does this: the Python steps read every
  aligned record ``O_DIRECT``. The native reader's buffered reads go through a per-thread
  staging chunk that the CPU cache holds, hashed and streamed into the row in one pass, so a
  resident record crosses memory once, as a memcpy does, not three times
  (docs/bench/2026-12-04-resident-read-one-pass.md). For a load that must not write its row
  until claimed, ``read_unless_resident`` and ``read_resident`` split that read around the
  claim, and
  ``read_claiming`` makes both in one call, claiming on the load's claim cell in between.
* With the native reader built (kvtier.native), a load's read is one C call: open, the checks
  below, ``preadv``, close and the payload's checksum, giving the GIL up once per block. The
  same steps in Python give it up five times, and each return waits for it while an engine
  thread runs Python (up to the 5 ms switch interval), which beside a busy Python thread
  costs the Python steps most of their speed (docs/benchmarks.md, "The disk tier's read path
  beside a busy Python thread"). A subclass that overrides ``read_into`` or ``open_for_read``
  (a test's fault) gets the Python steps, so its override is always what runs.
* ``fsync`` policy: "never" (default: a record lost or torn by a power cut fails its checksum
  and is a miss, never wrong data; fsync multiplies the put latency: docs/store.md), "data"
  (fdatasync before rename), "always" (also fsync the folder after rename).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import platform
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from kvtier import native
from kvtier.buffers import address_of
from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format.checksum import Buffer
from kvtier.format.record import HEADER_BYTES
from kvtier.store.disk.layout import DIR_MODE, open_private_file

log = logging.getLogger(__name__)

FSYNC_POLICIES = ("never", "data", "always")
_PAGE = mmap.PAGESIZE


class RecordIO:
    """Writes, publishes and reads record files; override a method to inject a fault."""

    def __init__(
        self,
        fsync: str = "never",
        direct_reads: bool = True,
        direct_writes: bool = True,
        drop_written_pages: bool = True,
        native_reads: bool = True,
        page_cache_reads: bool = True,
    ) -> None:
        """The switches exist for the benchmark's and tests' comparisons; keep the defaults.

        ``page_cache_reads=False`` reads even records the page cache holds ``O_DIRECT``.
        """
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"disk tier: fsync={fsync!r}; choose one of {FSYNC_POLICIES}")
        #: "never", "data" or "always" (see the module docstring).
        self.fsync = fsync
        self._drop_written_pages = drop_written_pages
        self._direct_ok = direct_reads and hasattr(os, "O_DIRECT")
        self._direct_writes_ok = direct_writes and hasattr(os, "O_DIRECT")
        self._page_cache_reads = page_cache_reads
        self._local = threading.local()
        reads_overridden = (
            type(self).read_into is not RecordIO.read_into
            or type(self).open_for_read is not RecordIO.open_for_read
        )
        self._reader = native.record_reader() if native_reads and not reads_overridden else None
        self._resident = (
            native.resident_reader() if self._reader is not None and page_cache_reads else None
        )
        self._claiming = native.claiming_reader() if self._resident is not None else None
        self._claiming_many = native.claiming_batch_reader() if self._claiming is not None else None
        # False once the kernel refused RWF_NOWAIT reads (read_resident): never again asked.
        self._resident_ok = self._resident is not None

    @property
    def native_reads(self) -> bool:
        """True when loads read through the native one-call reader."""
        return self._reader is not None

    @property
    def direct_reads(self) -> bool:
        """True while reads into page-aligned buffers use ``O_DIRECT``."""
        return self._direct_ok

    def write_temp(self, path: Path, header: bytes, payload: Buffer) -> None:
        """Create ``path`` (must not exist) holding header + payload, per the fsync policy.

        ``O_DIRECT`` when the payload is page-aligned (the header is copied into an aligned
        page), else buffered followed by ``DONTNEED``. On any error the partial file is
        removed and the error re-raised.
        """
        view = memoryview(payload)
        if self._direct_writes_ok and _aligned(view):
            staged = self._buffer("write_header")
            staged[:] = header
            try:
                self.write_file(path, staged, view, direct=True)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.warning("disk tier: O_DIRECT writes refused (%s); using buffered writes", exc)
                self._direct_writes_ok = False
                path.unlink(missing_ok=True)  # open may have created it before refusing
        self.write_file(path, header, view, direct=False)

    def write_file(self, path: Path, header: Buffer, payload: memoryview, direct: bool) -> None:
        """Create ``path`` with header + payload in one ``pwritev`` (``O_DIRECT`` if asked)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
        fd = open_private_file(path, flags)
        try:
            _full_io(os.pwritev, fd, [header, payload], expect_all=True)
            if self.fsync != "never":
                os.fdatasync(fd)
            if not direct and self._drop_written_pages:
                # Drops the pages if clean (after fdatasync); if dirty, starts write-back now.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)

    def publish(self, temp: Path, final: Path) -> None:
        """Atomically move a written temp file to its final name (creating its folder)."""
        try:
            os.rename(temp, final)
        except FileNotFoundError:
            if temp.exists():  # the fan-out folder is missing
                final.parent.mkdir(mode=DIR_MODE, exist_ok=True)
                os.rename(temp, final)
            else:
                raise
        if self.fsync == "always":
            fsync_dir(final.parent)

    def remove(self, path: Path) -> bool:
        """Unlink a record or temp file if present; True once it is gone.

        Folders and other errors are logged and give False (the file is still there).
        """
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("disk tier: could not remove %s: %s", path, exc)
            return False
        return True

    def read_into(self, path: Path, out: memoryview) -> memoryview:
        """Read the record at ``path``: payload into ``out``, header into a returned buffer.

        One ``preadv`` fills both. The returned header buffer is reused by the calling
        thread's next read. Raises ``CorruptRecordError`` ("symlink", "not_regular",
        "not_private", "length") for files that cannot be a valid record of ``out``'s size
        written by this user, ``FileNotFoundError`` when the file is gone, ``OSError`` for
        other faults.
        """
        header = self._buffer("read_header")
        direct = self._direct_ok and _aligned(out)
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
                got = _full_io(os.preadv, fd, [header, out])
            except OSError as exc:
                if exc.errno != errno.EINVAL or not direct:
                    raise
                self._disable_direct(exc)
                got = _full_io(os.preadv, fd, [header, out])
            if got != want:
                raise _short_read(path, got, want)
            return header
        finally:
            os.close(fd)

    def read_checked(
        self, path: Path, out: memoryview, checksum: bool
    ) -> tuple[memoryview, int | None, bool]:
        """``read_into``, plus the payload's XXH3-64 when the native reader computed it, and
        whether the record was copied from the page cache.

        The checksum comes back when ``checksum`` is asked, the reader is built and the
        header names XXH3-64; otherwise None, and the caller hashes ``out`` itself. The flag
        is True only for a read that would have been ``O_DIRECT`` and was buffered because
        the page cache held the whole record (native reader only). Raises what ``read_into``
        raises, for the same files.
        """
        reader = self._reader
        if reader is None or out.readonly or not out.c_contiguous:
            return self.read_into(path, out), None, False
        header = self._buffer("read_header")
        direct = self._direct_ok and _aligned(out)
        status, error, detail, detail2, refused, payload_checksum, cached = reader(
            os.fsencode(path), header, out, direct, checksum, self._page_cache_reads
        )
        if refused:
            self._native_direct_refused()
        _check_read(path, status, error, detail, detail2, HEADER_BYTES + out.nbytes)
        return header, payload_checksum, cached

    def reads_resident_into(self, out: memoryview) -> bool:
        """True when ``read_unless_resident`` may read a record for ``out``."""
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
        direct = self._direct_ok and _aligned(bounce)
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
        """True when ``read_claiming`` may read a record for ``out``."""
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
        direct = self._direct_ok and _aligned(bounce)
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
        direct = self._direct_ok and _aligned(bounce)
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

    def open_for_read(self, path: Path, direct: bool) -> int:
        """Open a record for reading without following links or blocking on a FIFO."""
        # O_NONBLOCK: a FIFO planted in place of a record must not hang the reader.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        return os.open(path, flags | (os.O_DIRECT if direct else 0))

    def _native_direct_refused(self) -> None:
        """The native reader found O_DIRECT refused on a regular file (it read buffered)."""
        self._disable_direct(OSError(errno.EINVAL, os.strerror(errno.EINVAL)))

    def _disable_direct(self, exc: OSError) -> None:
        if self._direct_ok:
            log.warning("disk tier: O_DIRECT reads refused (%s); using buffered reads", exc)
        self._direct_ok = False

    def _headers(self, count: int) -> memoryview:
        """``count`` page-aligned header-sized buffers of this thread, back to back."""
        buf: memoryview | None = getattr(self._local, "headers", None)
        if buf is None or buf.nbytes < count * HEADER_BYTES:
            buf = memoryview(mmap.mmap(-1, max(count, 16) * HEADER_BYTES))
            self._local.headers = buf
        return buf[: count * HEADER_BYTES]

    def _buffer(self, name: str) -> memoryview:
        """A page-aligned header-sized buffer of this thread (an anonymous mmap)."""
        buf = getattr(self._local, name, None)
        if buf is None:
            buf = memoryview(mmap.mmap(-1, HEADER_BYTES))
            setattr(self._local, name, buf)
        return buf


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


def _aligned(buf: memoryview) -> bool:
    """True if ``buf`` starts on a page and spans whole pages (what O_DIRECT needs here)."""
    if buf.readonly or not buf.c_contiguous or not buf.nbytes or buf.nbytes % _PAGE:
        return False
    return address_of(buf) % _PAGE == 0


def _full_io(
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
