"""Opening a disk store's namespace folder and recovering what crashed writers left behind.

* ``prepare_folders``: the root and namespace folders (0700, checked), namespace.json.
* ``clean_temp``: temp files of dead sessions (and stray ones an hour old).
* ``reclaim_dead``: pending rows and trash of dead sessions of any namespace under the root;
  their files are unlinked before their charge leaves the cap.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.format.namespace import Namespace
from kvtier.store.disk import layout
from kvtier.store.disk.index import Index
from kvtier.store.disk.session import is_alive, is_alive_under
from kvtier.store.disk.trash import Trash
from kvtier.store.disk.writer import RecordWriter

log = logging.getLogger(__name__)

#: Temp files whose name names no session are removed once this old.
STRAY_TEMP_AGE_S = 3600.0


def prepare_folders(root: Path, namespace_dir: Path, namespace: Namespace) -> None:
    """Create (0700) and check the root, the namespace folder and its sub-folders, and check
    or write namespace.json. Raises ``ConfigError`` for an unsafe folder or a namespace.json
    that names another namespace."""
    layout.make_private_dir(root, "root")
    layout.make_private_dir(namespace_dir, "namespace folder")
    for sub in (layout.BLOCKS, layout.TMP, layout.SESSIONS, layout.QUARANTINE):
        layout.make_private_dir(namespace_dir / sub, "store folder")
    _check_namespace_file(namespace_dir, namespace)


def clean_temp(namespace_dir: Path, own_session: str, writer: RecordWriter) -> None:
    """Remove temp files of dead sessions, and stray ones (no session in the name) an hour
    old. Removing only lowers usage, so no charge is touched."""
    for entry in os.scandir(namespace_dir / layout.TMP):
        session = layout.temp_session(entry.name)
        if session == own_session:
            continue
        if session is None:
            try:
                age_s = time.time() - entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:  # removed by another process since the listing
                continue
            stale = age_s > STRAY_TEMP_AGE_S
        else:
            stale = not is_alive(namespace_dir, session)
        if stale:
            writer.remove(Path(entry.path))


def reclaim_dead(root: Path, index: Index, trash: Trash) -> int:
    """Drop pending rows and adopt trash of dead sessions (any namespace), then empty it:
    one query, plus one lock probe per other session that has a write in flight. Returns
    the number of unfinished writes reclaimed."""
    own = index.session
    dead = [s for s in index.writer_sessions() if s != own and not is_alive_under(root, s)]
    pending, entries = index.reclaim(dead)
    if pending:
        log.info("disk tier: reclaimed %d unfinished writes of dead processes", len(pending))
    trash.empty(entries)
    return len(pending)


def _check_namespace_file(namespace_dir: Path, namespace: Namespace) -> None:
    path = namespace_dir / layout.NAMESPACE_FILE
    try:
        fd = layout.open_private_file(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        layout.write_small_file(path, namespace.to_json().encode())
        return
    try:
        text = os.read(fd, 1 << 20).decode("utf-8", "replace")
    finally:
        os.close(fd)
    try:
        stored = Namespace.from_json(text)
    except ConfigError as exc:
        log.warning("disk tier: %s unreadable (%s); rewriting it", path, exc)
        layout.write_small_file(path, namespace.to_json().encode())
        return
    if stored != namespace:
        raise ConfigError(
            f"disk tier: {path} describes namespace {stored.digest_hex()}, but the folder is "
            f"named for {namespace.digest_hex()}; remove the folder {namespace_dir}"
        )
