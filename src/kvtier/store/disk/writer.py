"""Writing record files: create a temp file, publish it under its name, remove what is gone.

``RecordWriter`` holds no state about records; the store decides what to write where (the
crash story is ``kvtier.store.disk.store``'s). Subclass it and override one method to inject
a write fault (a crash between write and rename, ENOSPC, a torn write).

Choices (figures and the command that produced them in docs/store.md):

* Writes use ``O_DIRECT`` when the payload is page-aligned and a whole number of pages
  (host-pool rows should be): the KV never lands in the page cache, so a burst of offloads
  cannot pile up gigabytes of dirty memory next to the host pool, and a put returns once the
  device has the data. Measured: buffered writes left 100% of the written bytes cached even
  with ``posix_fadvise(DONTNEED)`` right after them (the pages are still dirty then, so the
  kernel keeps them); dropping them properly needs an fdatasync first, which cost 2-3x the
  put latency of ``O_DIRECT``. Unaligned payloads fall back to buffered ``pwritev`` +
  ``DONTNEED`` (which at least starts write-back at once).
* A batch of records is written by ``write_records`` in one call of the native writer
  (kvtier.native, compiled when kvtier is installed): open, write, close and rename for every
  record with the GIL given up once, where the Python steps give it up five times a record and
  each return waits for it while an engine thread runs Python. The Python steps remain for
  subclasses that inject faults into them, for fsync "always" and where the writer is not built.
* ``fsync`` policy: "never" (default: a record lost or torn by a power cut fails its checksum
  and is a miss, never wrong data; fsync cost 2-3x the put latency), "data" (fdatasync before
  rename), "always" (also fsync the folder after rename).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.format.checksum import Buffer
from kvtier.format.record import HEADER_BYTES
from kvtier.native import files_unlinker, records_writer
from kvtier.store.disk.io import aligned, fsync_dir, full_io
from kvtier.store.disk.layout import DIR_MODE, open_private_file

log = logging.getLogger(__name__)

FSYNC_POLICIES = ("never", "data", "always")


#: One record to write: (temp path, final path, header, payload).
Record = tuple[Path, Path, bytes, Buffer]


class RecordWriter:
    """Writes and publishes record files, and removes them; override a method to inject a
    fault."""

    def __init__(
        self, fsync: str = "never", direct_writes: bool = True, drop_written_pages: bool = True
    ) -> None:
        """The switches exist for the benchmark's and tests' comparisons; keep the defaults."""
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"disk tier: fsync={fsync!r}; choose one of {FSYNC_POLICIES}")
        #: "never", "data" or "always" (see the module docstring).
        self.fsync = fsync
        self._drop_written_pages = drop_written_pages
        self._direct_writes_ok = direct_writes and hasattr(os, "O_DIRECT")
        self._local = threading.local()
        # The native writer makes the Python steps' calls itself, so it would skip a fault a
        # subclass injects into one of them.
        steps = ("write_temp", "write_file", "publish")
        python_steps = any(getattr(type(self), m) is not getattr(RecordWriter, m) for m in steps)
        self._native = None if python_steps or fsync == "always" else records_writer()

    def write_records(self, records: list[Record]) -> list[OSError | None]:
        """Write each record's temp file and publish it under its final name (``write_temp``
        then ``publish``); per record, None once published or the error that stopped it (the
        caller removes what a failed record left). One native call for the batch where the
        writer is built."""
        if self._native is None or not records:
            return [self._write_one(*record) for record in records]
        write, status = self._native
        direct = self._direct_writes_ok and all(aligned(memoryview(r[3])) for r in records)
        headers = self._header_pages(len(records)) if direct else None
        batch = []
        for i, (temp, final, header, payload) in enumerate(records):
            if headers is not None:
                staged = headers[i * HEADER_BYTES : (i + 1) * HEADER_BYTES]
                staged[:] = header
                header = staged
            batch.append((temp, final, header, payload))
        outcomes = write(batch, direct, self.fsync != "never", self._drop_written_pages)
        errors: list[OSError | None] = []
        for (temp, final, header, payload), (code, error) in zip(records, outcomes, strict=True):
            if code == status.ok:
                errors.append(None)
            elif code == status.no_folder:  # written: publish makes the folder
                errors.append(_error_of(self.publish, temp, final))
            elif code == status.direct_refused:
                if self._direct_writes_ok:  # once, as write_temp says it
                    log.warning("disk tier: O_DIRECT writes refused; using buffered writes")
                    self._direct_writes_ok = False
                errors.append(self._write_one(temp, final, header, payload))
            else:
                errors.append(OSError(error, os.strerror(error), str(temp)))
        return errors

    def _write_one(self, temp: Path, final: Path, header: bytes, payload: Buffer) -> OSError | None:
        return _error_of(self.write_temp, temp, header, payload) or _error_of(
            self.publish, temp, final
        )

    def write_temp(self, path: Path, header: bytes, payload: Buffer) -> None:
        """Create ``path`` (must not exist) holding header + payload, per the fsync policy.

        ``O_DIRECT`` when the payload is page-aligned (the header is copied into an aligned
        page), else buffered followed by ``DONTNEED``. On any error the partial file is
        removed and the error re-raised.
        """
        view = memoryview(payload)
        if self._direct_writes_ok and aligned(view):
            staged = self._header_buffer()
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
            full_io(os.pwritev, fd, [header, payload], expect_all=True)
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
        """Unlink a record or temp file if present; True once it is gone (``remove_many``)."""
        return self.remove_many([path])[0]

    def remove_many(self, paths: list[Path]) -> list[bool]:
        """Unlink record or temp files if present, in order; per path, True once it is gone.

        Folders and other errors are logged and give False (the file is still there). One
        native call for the list where the writer is built: a full store's batch of puts
        evicts as many records as it writes, and an unlink each gave the GIL up once a record.
        Every removal comes here (``remove`` too): override it to inject a fault.
        """
        unlink = files_unlinker()
        if unlink is None:
            return [self._remove_one(path) for path in paths]
        gone = []
        for path, error in zip(paths, unlink([os.fsencode(p) for p in paths]), strict=True):
            if error:
                log.warning(
                    "disk tier: could not remove %s: %s", path, OSError(error, os.strerror(error))
                )
            gone.append(not error)
        return gone

    @staticmethod
    def _remove_one(path: Path) -> bool:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("disk tier: could not remove %s: %s", path, exc)
            return False
        return True

    def _header_pages(self, count: int) -> memoryview:
        """Page-aligned room for ``count`` headers, this thread's (an anonymous mmap)."""
        buf: memoryview | None = getattr(self._local, "headers", None)
        if buf is None or buf.nbytes < count * HEADER_BYTES:
            buf = memoryview(mmap.mmap(-1, count * HEADER_BYTES))
            self._local.headers = buf
        return buf

    def _header_buffer(self) -> memoryview:
        """A page-aligned header-sized buffer of this thread (an anonymous mmap)."""
        buf: memoryview | None = getattr(self._local, "header", None)
        if buf is None:
            buf = memoryview(mmap.mmap(-1, HEADER_BYTES))
            self._local.header = buf
        return buf


def _error_of(step: Callable[..., None], *args: object) -> OSError | None:
    """Run one of the writer's steps; the ``OSError`` that stopped it, or None."""
    try:
        step(*args)
    except OSError as exc:
        return exc
    return None
