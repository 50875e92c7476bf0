"""Quarantine: where records that failed a check go, so they are kept for a look but never read.

A quarantined entry is renamed (never copied, never opened) into ``quarantine/`` as
``<key hex>.<record id>.<reason>.<unix ns>.kvb``, with ``<same name>.reason`` beside it
holding the detail. Renaming works for whatever sits there: a file, a symlink (the link
itself moves), a FIFO, a folder. Only the newest ``max_entries`` are kept, so a disk that
rots cannot fill the file system with quarantine.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from kvtier.store.layout import QUARANTINE, RECORD_SUFFIX, open_private_file

log = logging.getLogger(__name__)

REASON_SUFFIX = ".reason"


def quarantine(
    namespace_dir: Path, relative: str, label: str, reason: str, detail: str, max_entries: int
) -> str | None:
    """Move ``namespace_dir/relative`` into quarantine; return its new name, None if gone.

    ``label`` identifies the record (key hex and record id) in the new name.
    """
    name = f"{label}.{reason}.{time.time_ns()}{RECORD_SUFFIX}"
    folder = namespace_dir / QUARANTINE
    source = namespace_dir / relative
    try:
        os.rename(source, folder / name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        # Cannot keep it for a look; at least make sure nobody reads it again.
        log.warning("disk tier: cannot quarantine %s (%s); removing it", relative, exc)
        try:
            if source.is_dir() and not source.is_symlink():
                shutil.rmtree(source)
            else:
                source.unlink(missing_ok=True)
        except OSError as unlink_exc:
            log.error("disk tier: cannot remove bad record %s: %s", relative, unlink_exc)
        return None
    log.warning("disk tier: quarantined %s as %s: %s", relative, reason, detail)
    try:
        fd = open_private_file(folder / f"{name}{REASON_SUFFIX}", os.O_WRONLY | os.O_CREAT)
        try:
            os.write(fd, f"{relative}\n{reason}\n{detail}\n".encode())
        finally:
            os.close(fd)
        prune(folder, max_entries)
    except OSError as exc:
        log.warning("disk tier: quarantine bookkeeping failed: %s", exc)
    return name


def prune(folder: Path, max_entries: int) -> int:
    """Remove the oldest quarantine entries beyond ``max_entries``; return how many went."""
    entries = sorted(
        (e for e in os.scandir(folder) if e.name.endswith(RECORD_SUFFIX)),
        key=lambda e: _written_ns(e.name),
    )
    excess = entries[: max(0, len(entries) - max_entries)]
    for entry in excess:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)
        Path(entry.path + REASON_SUFFIX).unlink(missing_ok=True)
    return len(excess)


def entries(namespace_dir: Path) -> list[str]:
    """Names of the quarantined entries, oldest first."""
    names = [n for n in os.listdir(namespace_dir / QUARANTINE) if n.endswith(RECORD_SUFFIX)]
    return sorted(names, key=_written_ns)


def _written_ns(name: str) -> int:
    stamp = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    return int(stamp) if stamp.isdigit() else 0
