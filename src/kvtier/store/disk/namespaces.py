"""Listing and removing the namespaces stored under a disk tier root.

A root holds one folder per namespace (model + weights + KV layout + hash + format). Old
ones stay until removed: ``list_namespaces`` shows what each holds, ``remove_namespace``
deletes one that no running store has open.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

from kvtier.errors import ConfigError, KvtierError
from kvtier.format.namespace import Namespace
from kvtier.store.disk import layout
from kvtier.store.disk.inspect import read_namespace
from kvtier.store.disk.root import open_index
from kvtier.store.disk.session import reap_dead_sessions

_DIGEST_HEX = re.compile(r"^[0-9a-f]{32}$")


class NamespaceUsage(NamedTuple):
    """One namespace folder under a root."""

    #: Folder name: the namespace digest in hex.
    digest_hex: str
    #: The namespace from namespace.json; None if the file is missing or unreadable.
    namespace: Namespace | None
    #: Bytes of record files on disk (a scan of blocks/, not the index).
    used_bytes: int


def list_namespaces(root: Path | str) -> list[NamespaceUsage]:
    """Every namespace folder under ``root``, sorted by digest; [] if ``root`` is absent."""
    root = Path(root)
    layout.check_private_dir(root, "root")
    if not root.exists():
        return []
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if _DIGEST_HEX.match(entry.name) and entry.is_dir(follow_symlinks=False):
            found.append(
                NamespaceUsage(
                    entry.name,
                    read_namespace(Path(entry.path)),
                    _bytes_under(Path(entry.path) / layout.BLOCKS),
                )
            )
    return found


def remove_namespace(root: Path | str, digest_hex: str) -> int:
    """Delete the folder of namespace ``digest_hex``; return the record bytes freed.

    Raises ``ConfigError`` for a malformed or unknown digest and ``KvtierError`` if a
    running store has the namespace open (stop it first).
    """
    root = Path(root)
    if not _DIGEST_HEX.match(digest_hex):
        raise ConfigError(f"namespace {digest_hex!r} is not a 32-digit hex digest; see `kvtier ls`")
    layout.check_private_dir(root, "root")
    folder = root / digest_hex
    layout.check_private_dir(folder, "namespace folder")
    if not folder.is_dir():
        raise ConfigError(f"no namespace {digest_hex} under {root}; see `kvtier ls`")
    sessions = folder / layout.SESSIONS
    if sessions.is_dir():
        reap_dead_sessions(folder)
        if any(name.endswith(".lock") for name in os.listdir(sessions)):
            raise KvtierError(
                f"namespace {digest_hex} is open by a running store; stop it, then retry"
            )
    freed = _bytes_under(folder / layout.BLOCKS)
    shutil.rmtree(folder)
    # Files first, then their charge: the root's usage never undercounts what is on disk.
    if (root / layout.INDEX_FILE).exists():
        index = open_index(root.absolute(), "remove-" + os.urandom(4).hex(), None, 30.0)
        try:
            index.forget_namespace(digest_hex)
        finally:
            index.close()
    return freed


def _bytes_under(folder: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
