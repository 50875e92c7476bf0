"""Where a disk store keeps things, and the permission rules for its folders.

::

    <root>/                         0700 (refused if a symlink or group/other-writable)
      index.sqlite3 (+ -wal -shm)   0600, the root's index, shared by its namespaces
                                    (kvtier.store.disk.index; schema 1 had one per namespace)
      <namespace digest hex>/       0700, one per Namespace
        namespace.json              0600, Namespace.to_json()
        decision.json               0600, the restore decision's evidence (written by the
                                    engine, kvtier.policy.evidence_file; at most
                                    DECISION_FILE_MAX_BYTES; the store never reads it)
        blocks/<kk>/<key hex>.<record id>.kvb   record files; <kk> = first key byte in hex
        tmp/<key hex>.<record id>.<session>.tmp files being written
        sessions/<session>.lock     flock held by each open store (liveness of writers)
        quarantine/<key hex>.<record id>.<reason>.<ns>.kvb   records that failed checks

One fan-out level (256 folders) rather than two: 256 x 65536 folders would cost an inode each
and make a full scan (``verify``) walk mostly empty folders; ext4's hashed directories keep
lookups fast with tens of thousands of files per folder. The record id in the file name makes
every write a new name, so removing an old version can never delete a newer one written
concurrently by another process under the same key.

Small files beside the data (``namespace.json``, ``decision.json``) are replaced atomically
(``write_small_file``: a uniquely named ``.<name>.<pid>.<random>.tmp`` beside it, fsync,
rename, fsync of the folder) and read bounded (``read_small_file``), so a reader sees the old
or the new file, never a torn one, and a planted FIFO or symlink is refused, not followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from kvtier.errors import ConfigError

DIR_MODE = 0o700
FILE_MODE = 0o600
RECORD_SUFFIX = ".kvb"
TEMP_SUFFIX = ".tmp"
NAMESPACE_FILE = "namespace.json"
DECISION_FILE = "decision.json"
#: The most a decision file may hold (its writer trims to fit; a larger one is not read).
DECISION_FILE_MAX_BYTES = 8192
INDEX_FILE = "index.sqlite3"
BLOCKS = "blocks"
TMP = "tmp"
SESSIONS = "sessions"
QUARANTINE = "quarantine"


def record_name(key: bytes, record_id: int) -> str:
    """Relative path of a record file inside the namespace folder."""
    return f"{BLOCKS}/{key[:1].hex()}/{key.hex()}.{record_id}{RECORD_SUFFIX}"


def parse_record_name(relative: str) -> tuple[bytes, int] | None:
    """Inverse of ``record_name``: (key, record id), or None for a name it does not make."""
    parts = relative.split("/")
    if len(parts) != 3 or parts[0] != BLOCKS or not parts[2].endswith(RECORD_SUFFIX):
        return None
    stem = parts[2][: -len(RECORD_SUFFIX)]
    key_hex, _, id_text = stem.partition(".")
    try:
        key, record_id = bytes.fromhex(key_hex), int(id_text)
    except ValueError:
        return None
    if not key or parts[1] != key[:1].hex() or record_name(key, record_id) != relative:
        return None
    return key, record_id


def temp_name(key: bytes, record_id: int, session: str) -> str:
    """Relative path of the temp file a session writes a record into before publishing it."""
    return f"{TMP}/{key.hex()}.{record_id}.{session}{TEMP_SUFFIX}"


def temp_session(name: str) -> str | None:
    """The writer session encoded in a temp file's name, or None if it is not ours."""
    parts = name.split(".")
    if len(parts) != 4 or "." + parts[3] != TEMP_SUFFIX:
        return None
    return parts[2]


def check_private_dir(path: Path, what: str) -> None:
    """Refuse a folder that is a symlink, not a folder, not ours, or writable by others.

    Raises ``ConfigError`` naming the path and the fix. Does nothing if ``path`` is absent.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"disk tier: {what} {path} is a symlink (to {os.path.realpath(path)}); "
            f"give the real folder as the root so files cannot be redirected"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"disk tier: {what} {path} is not a folder; give a folder path")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"disk tier: {what} {path} belongs to uid {st.st_uid}, not this user "
            f"({os.geteuid()}); use a folder you own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"disk tier: {what} {path} is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):#o}); run `chmod 700 {path}` or use a private folder"
        )


def make_private_dir(path: Path, what: str) -> None:
    """Create ``path`` (and missing parents) as 0700 regardless of umask, then check it."""
    check_private_dir(path, what)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            pass
        else:
            os.chmod(path, DIR_MODE, follow_symlinks=False)
    check_private_dir(path, what)


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
