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
at most every ``MEASURE_INTERVAL_S``, a folder's sub-folders listed and measured in one native
call where the record writer is built (``kvtier.native.folder_stats``: in Python every entry
read and every ``lstat`` gives the GIL up once, over 500 hand-overs a measurement, each taking
the GIL from the engine's loop on return); in between it measures again the two folders each of
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
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtier import native
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
    found = {root: _folder_charges([root])[0]}
    for ns, ns_charge in _subfolder_charges(root).items():
        found[ns] = ns_charge
        for sub, sub_charge in _subfolder_charges(ns).items():
            found[sub] = sub_charge
            if sub.name == layout.BLOCKS:
                found.update(_subfolder_charges(sub))
    return found


def _subfolder_charges(folder: Path) -> dict[Path, int]:
    """The folders directly in ``folder`` (links not followed), each with its charge."""
    native_stats = native.folder_stats()
    if native_stats is not None:
        listed = native_stats[1](os.fsencode(folder))
        return {folder / os.fsdecode(n): _charge_of(s, b) for n, s, b in listed or ()}
    try:
        with os.scandir(folder) as entries:
            subfolders = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return {}
    return dict(zip(subfolders, _folder_charges(subfolders), strict=True))


def _folder_charges(folders: Sequence[Path]) -> list[int]:
    """Each folder's charge (0 for what is not a folder, or is gone)."""
    native_stats = native.folder_stats()
    if native_stats is not None:
        sizes = native_stats[0]([os.fsencode(f) for f in folders])
        return [0 if found is None else _charge_of(*found) for found in sizes]
    return [_folder_charge(folder) for folder in folders]


def _folder_charge(folder: Path) -> int:
    try:
        st = os.lstat(folder)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return 0
    return _charge_of(st.st_size, st.st_blocks)


def _charge_of(size: int, blocks: int) -> int:
    """A folder's charge from its ``st_size`` and ``st_blocks`` (512-byte units)."""
    return max(charge(size), charge(blocks * 512), ALLOC_UNIT)


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
            for folder, now in zip(folders, _folder_charges(folders), strict=True):
                self._total += now - self._seen.get(folder, 0)  # absent: created since
                self._seen[folder] = now

    def measure(self) -> int:
        """Bytes the folders take now, measured (``footprint_bytes``)."""
        return folders_bytes(self._root)
