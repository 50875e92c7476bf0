"""The slow disk of ``tests.support.throttled_disk`` for tests: skips where it cannot be made.

``slow_disk_or_skip(folder)`` yields a ``SlowDisk`` (loop device + ext4 + mount + blkio cgroup
v1 read throttle; move engine processes in with ``add_session``), or skips the test with the
reason (not root, no cgroup v1 blkio or not writable, no loop devices, mounting refused: a
container's root may lack CAP_SYS_ADMIN). Everything is undone on exit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.host import loop_mount_unavailable, need
from tests.support.throttled_disk import BLKIO_ROOT, SlowDisk, slow_disk, unavailable

__all__ = ["SlowDisk", "slow_disk_or_skip"]


@contextmanager
def slow_disk_or_skip(folder: Path, size: str = "1G") -> Iterator[SlowDisk]:
    need(unavailable())
    need(loop_mount_unavailable())
    if not os.access(BLKIO_ROOT, os.W_OK):
        pytest.skip(f"{BLKIO_ROOT} is not writable here (a read-only cgroup mount)")
    with slow_disk(folder, size) as disk:
        yield disk
