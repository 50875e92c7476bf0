"""What the disk root's folders take, so the cap bounds ``du -s`` of the root and not only
the sum of its files.

Every folder costs at least one allocation unit (4 KiB on ext4 and xfs), and a folder holding
many names grows by a unit at a time (and never shrinks on ext4). A namespace has up to 261
folders (itself, ``blocks``, ``tmp``, ``sessions``, ``quarantine`` and 256 fan-out folders of
``blocks``): about 1 MiB, which a small cap cannot ignore.

The folders are measured (each one's allocated size, at least its length rounded up to the
unit) rather than bounded in advance: a fixed bound of 261 units per namespace would take a
megabyte from every small cap, and a bound on growth would have to assume the longest names.
Measuring all of them costs about a millisecond (261 ``lstat``), so a store measures them all
at most every ``MEASURE_INTERVAL_S``; in between it measures again the two folders each of
its puts wrote into (the fan-out folder and ``tmp``), and a reservation adds
``GROWTH_PER_PUT_BYTES`` for each put it is for (a put creates at most one fan-out folder and
grows at most one folder by a unit). Another process's puts within that second are covered by
the index's growth margin (``kvtier.store.disk.root.INDEX_GROWTH_MARGIN_BYTES``).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvtier.store.disk import layout
from kvtier.store.disk.schema import ALLOC_UNIT, charge

#: Longest a measurement is reused.
MEASURE_INTERVAL_S = 1.0
#: What one put may add to the folders before the next measurement.
GROWTH_PER_PUT_BYTES = 2 * ALLOC_UNIT


def folders_bytes(root: Path) -> int:
    """Allocated bytes of the root folder and every folder kvtier keeps under it (namespace
    folders, their sub-folders, the fan-out folders); folders inside quarantine are charged
    with their quarantine entry."""
    return sum(folder_charges(root).values())


def folder_charges(root: Path) -> dict[Path, int]:
    """``folders_bytes`` folder by folder."""
    found = {root: _folder_charge(root)}
    for ns in _subfolders(root):
        found[ns] = _folder_charge(ns)
        for sub in _subfolders(ns):
            found[sub] = _folder_charge(sub)
            if sub.name == layout.BLOCKS:
                found.update((fan, _folder_charge(fan)) for fan in _subfolders(sub))
    return found


def _subfolders(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as found:
            return [Path(e.path) for e in found if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _folder_charge(folder: Path) -> int:
    try:
        st = os.lstat(folder)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return 0
    return max(charge(st.st_size), charge(st.st_blocks * 512), ALLOC_UNIT)


class FolderCharge:
    """One store's view of ``folders_bytes``: measured at most every MEASURE_INTERVAL_S;
    in between, the folders its own puts wrote into are measured again after each put, and
    a reservation adds GROWTH_PER_PUT_BYTES for the put it is for. Thread-safe."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._root = root
        self._clock = clock
        self._lock = threading.Lock()
        self._total = 0
        self._seen: dict[Path, int] = {}
        self._at = float("-inf")

    def charge(self, puts: int = 1) -> int:
        """Bytes the folders may take once the ``puts`` being reserved are published."""
        with self._lock:
            if self._clock() - self._at >= MEASURE_INTERVAL_S:
                self._seen = folder_charges(self._root)
                self._total = sum(self._seen.values())
                self._at = self._clock()
            return self._total + GROWTH_PER_PUT_BYTES * puts

    def note_put(self, *folders: Path) -> None:
        """A record was published into ``folders`` (created or grown): measure them again."""
        with self._lock:
            for folder in folders:
                now = _folder_charge(folder)
                self._total += now - self._seen.get(folder, 0)  # absent: created since
                self._seen[folder] = now

    def measure(self) -> int:
        """Bytes the folders take now, measured (``footprint_bytes``)."""
        return folders_bytes(self._root)
