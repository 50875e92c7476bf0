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

import os
import stat
from pathlib import Path

from kvtier.errors import ConfigError

# Small files beside the data are kvtier's, not the store's alone (the engine writes the
# decision file): their I/O lives in a module every package may import.
from kvtier.small_files import DECISION_FILE_MAX_BYTES as DECISION_FILE_MAX_BYTES
from kvtier.small_files import FILE_MODE as FILE_MODE
from kvtier.small_files import TEMP_SUFFIX as TEMP_SUFFIX
from kvtier.small_files import open_private_file as open_private_file
from kvtier.small_files import read_small_file as read_small_file
from kvtier.small_files import small_file_temp_of as small_file_temp_of
from kvtier.small_files import write_small_file as write_small_file

DIR_MODE = 0o700
RECORD_SUFFIX = ".kvb"
NAMESPACE_FILE = "namespace.json"
DECISION_FILE = "decision.json"
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
