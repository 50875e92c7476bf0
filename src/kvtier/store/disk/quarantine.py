"""Quarantine: where records that failed a check go, so they are kept for a look but never read.

A quarantined entry is renamed (never copied, never opened) into ``quarantine/`` as
``<key hex>.<record id>.<reason>.<unix ns>.kvb``, with ``<same name>.reason`` beside it
holding the detail. Renaming works for whatever sits there: a file, a symlink (the link
itself moves), a FIFO, a folder. Every entry is charged against the root's cap (its size
rounded up, plus one allocation unit for the reason file) from the moment it is renamed until
its files are removed, and the root keeps at most ``Limits`` entries and bytes (oldest removed
first), so a disk that rots cannot fill the file system with quarantine.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from kvtier.store.disk.index import ALLOC_UNIT, Index, charge
from kvtier.store.disk.layout import QUARANTINE, RECORD_SUFFIX, open_private_file

log = logging.getLogger(__name__)

REASON_SUFFIX = ".reason"


@dataclass(frozen=True)
class Limits:
    """How much quarantine a root keeps: entries and charged bytes; oldest go first."""

    max_entries: int
    max_bytes: int


def quarantine(
    root: Path,
    index: Index,
    relative: str,
    label: str,
    reason: str,
    detail: str,
    limits: Limits,
    record_id: int | None = None,
) -> str | None:
    """Move ``root/relative`` (a path in a namespace folder) into that folder's quarantine,
    charge it and drop row ``record_id`` (if given) in one index transaction, then prune.

    ``label`` identifies the record (key hex and record id) in the new name. Returns the
    new name, or None if the entry was not moved: gone already, or removed because it could
    not be moved (the caller checks whether it is still there and keeps it named if so).
    """
    ns, inner = relative.split("/", 1)
    name = f"{label}.{reason}.{time.time_ns()}{RECORD_SUFFIX}"
    folder = root / ns / QUARANTINE
    source = root / relative
    try:
        os.rename(source, folder / name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        # Cannot keep it for a look; at least make sure nobody reads it again.
        log.warning("disk tier: cannot quarantine %s (%s); removing it", inner, exc)
        _remove(source)
        return None
    moved = folder / name
    try:
        # The entry and its reason file: charged before the reason file exists.
        cost = _allocated(moved) + ALLOC_UNIT
        index.quarantine_record(record_id, f"{ns}/{QUARANTINE}/{name}", cost)
    except (OSError, sqlite3.Error) as exc:
        # Uncharged bytes must not stay: lose the evidence rather than break the cap.
        log.warning("disk tier: cannot charge quarantined %s (%s); removing it", inner, exc)
        _remove(moved)
        return None
    log.warning("disk tier: quarantined %s as %s: %s", inner, reason, detail)
    try:
        fd = open_private_file(folder / f"{name}{REASON_SUFFIX}", os.O_WRONLY | os.O_CREAT)
        try:
            os.write(fd, f"{inner}\n{reason}\n{detail}\n".encode()[:ALLOC_UNIT])
        finally:
            os.close(fd)
        prune(root, index, limits)
    except (OSError, sqlite3.Error) as exc:
        log.warning("disk tier: quarantine bookkeeping failed: %s", exc)
    return name


def prune(root: Path, index: Index, limits: Limits) -> int:
    """Remove the oldest quarantine entries of the root beyond the limits (files first, then
    their charge); return how many went."""
    found = index.quarantined()
    total = sum(cost for _, cost, _ in found)
    excess = []
    for path, cost, _ in found:
        if len(found) - len(excess) <= limits.max_entries and total <= limits.max_bytes:
            break
        excess.append(path)
        total -= cost
    done = []
    for path in excess:
        if _remove(root / path) and _remove(root / f"{path}{REASON_SUFFIX}"):
            done.append(path)
    index.quarantine_done(done)
    return len(done)


def entries(namespace_dir: Path) -> list[str]:
    """Names of the quarantined entries, oldest first."""
    names = [n for n in os.listdir(namespace_dir / QUARANTINE) if n.endswith(RECORD_SUFFIX)]
    return sorted(names, key=_written_ns)


def _written_ns(name: str) -> int:
    stamp = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    return int(stamp) if stamp.isdigit() else 0


def _allocated(path: Path) -> int:
    """Charge of whatever sits at ``path``: a file's size, a folder's files' sizes."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return charge(st.st_size)
    total = charge(st.st_size)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            try:
                total += charge(os.lstat(os.path.join(dirpath, name)).st_size)
            except OSError:
                continue
    return total


def _remove(path: Path) -> bool:
    """Remove a file, link or folder; True once it is gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("disk tier: cannot remove %s: %s", path, exc)
        return False
    return True
