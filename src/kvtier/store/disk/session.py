"""Writer sessions: telling a crashed writer from a live one, across processes.

Each open ``DiskStore`` is a *session*: a random id, and an exclusive ``flock`` held on
``sessions/<id>.lock`` for as long as the store is open. Index rows and temp files of
unfinished writes carry their session id. The kernel drops a flock when its holder dies, so
"can I take this session's lock?" is a liveness test that survives pid reuse and also tells
apart two stores opened in one process (flocks belong to open file descriptions, not pids).

Rejected: recording pids and probing with ``kill(pid, 0)`` (pid reuse makes a dead writer
look alive forever, and a store closed inside a living process looks alive); age-only grace
periods (a slow writer of a big block is reclaimed under its feet).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from kvtier.store.disk.layout import SESSIONS, open_private_file

_SUFFIX = ".lock"
_STAGING = ".new"
_STAGING_GRACE_S = 60.0


class Session:
    """This store's liveness lock. ``close()`` releases it and removes its file."""

    def __init__(self, namespace_dir: Path) -> None:
        self.session_id = os.urandom(8).hex()
        self._path = namespace_dir / SESSIONS / f"{self.session_id}{_SUFFIX}"
        # Lock under a private name, then rename: nobody can see the file unlocked.
        staging = self._path.with_suffix(_STAGING)
        self._fd: int | None = open_private_file(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, self._path)

    def close(self) -> None:
        if self._fd is None:
            return
        self._path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def is_alive(namespace_dir: Path, session_id: str) -> bool:
    """True if the session's lock is held by an open store (in any process, this one too).

    A dead session's lock file is removed on the way. Never blocks.
    """
    return not _remove_if_unlocked(namespace_dir / SESSIONS / f"{session_id}{_SUFFIX}")


def is_alive_under(root: Path, session_id: str) -> bool:
    """``is_alive`` for a session of any namespace folder under ``root`` (whose folder is
    not known): alive if some namespace folder holds its lock locked."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return False
    for name in names:
        lock = root / name / SESSIONS / f"{session_id}{_SUFFIX}"
        if os.path.lexists(lock) and is_alive(root / name, session_id):
            return True
    return False


def reap_dead_sessions(namespace_dir: Path) -> int:
    """Remove lock files no live store holds; return how many.

    A crash between creating and renaming a lock leaves a ``.new`` file; those are removed
    only once a minute old, since a store being opened holds its ``.new`` briefly unlocked.
    """
    removed = 0
    for entry in os.scandir(namespace_dir / SESSIONS):
        if entry.name.endswith(_STAGING):
            try:
                age_s = time.time() - entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:  # renamed or reaped since the listing
                continue
            if age_s < _STAGING_GRACE_S:
                continue
        removed += _remove_if_unlocked(Path(entry.path))
    return removed


def _remove_if_unlocked(path: Path) -> bool:
    """Unlink ``path`` unless someone holds a flock on it; True if it is gone."""
    try:
        fd = open_private_file(path, os.O_RDWR | os.O_NONBLOCK)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)
