"""One ``sample`` event of the soak: what the servers hold (descriptors, threads, RSS), what
the disk folders take against their caps, and what could leak (/dev/shm regions, temp files).

Cheap by design (it runs every ~5 s for an hour): /proc reads and one ``lstat`` per entry
of each folder, no subprocess. A pid or file that vanishes mid-sample is skipped, never an
error: servers are killed on purpose and the store deletes files while we walk.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def take(processes: Mapping[str, int], folders: Mapping[str, tuple[Path, int]]) -> dict:
    """The ``sample`` event's fields (without ``type``/``t``) for the labelled pids (each
    summed over the process and its descendants) and folders (path, cap_bytes)."""
    raise NotImplementedError
