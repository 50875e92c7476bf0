"""Small private files, replaced atomically and read bounded.

The files beside a disk store's records (``namespace.json``, the store's; ``decision.json``,
the restore decision's evidence, written by the engine: ``kvtier.policy.evidence_file``) are
written by more than one package, so their I/O lives here, importing no package of kvtier's:
the store and the policy each use it without importing the other.

``write_small_file`` replaces a file through a uniquely named ``.<name>.<pid>.<random>.tmp``
beside it (fsync, rename, fsync of the folder) and ``read_small_file`` reads at most a bound,
so a reader sees the old or the new file, never a torn one, and a planted FIFO or symlink is
refused, not followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

#: Mode of every file kvtier creates: this user's only.
FILE_MODE = 0o600
#: Suffix of a file being written, before it is renamed to its name.
TEMP_SUFFIX = ".tmp"
#: The most a decision file may hold (its writer trims to fit; a larger one is not read).
DECISION_FILE_MAX_BYTES = 8192


def open_private_file(path: Path, flags: int) -> int:
    """``os.open`` with O_NOFOLLOW|O_CLOEXEC; a created file gets 0600 regardless of umask."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    if flags & os.O_CREAT:
        try:
            os.fchmod(fd, FILE_MODE)
        except OSError:
            os.close(fd)
            raise
    return fd


def small_file_temp_of(name: str) -> str | None:
    """The file a ``write_small_file`` temp file (``.<name>.<pid>.<random>.tmp``) was
    replacing, or None if ``name`` is no such temp file."""
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return None
    target, _, rest = name[1 : -len(TEMP_SUFFIX)].rpartition(".")
    target, _, pid = target.rpartition(".")
    if not (target and pid.isdigit() and len(rest) == 8):
        return None
    return target


def write_small_file(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data`` (0600): temp file, fsync, rename, fsync of
    the folder. On failure the temp file is removed and the old file, if any, stays."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}{TEMP_SUFFIX}")
    fd = open_private_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename is durable only once the folder is: without this a power cut could bring
    # back the old file (or none) after a reader saw the new one.
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_small_file(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of the small file ``path``; None if there is none.

    Raises ``OSError`` if it cannot be read, is a symlink (``ELOOP``), is not a regular file
    (``EINVAL``: a FIFO is opened non-blocking, never waited on) or holds more than
    ``max_bytes`` (``EFBIG``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than {max_bytes}", str(path))
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:  # grew after the fstat (it is replaced, never appended to)
            raise OSError(errno.EFBIG, f"more than {max_bytes} bytes", str(path))
        return data
    finally:
        os.close(fd)
