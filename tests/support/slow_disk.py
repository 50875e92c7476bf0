"""The slow disk of ``tests.support.throttled_disk`` for tests: skips where it cannot be made.

``slow_disk_or_skip(folder)`` yields a ``SlowDisk`` (loop device + ext4 + mount + blkio cgroup
v1 read throttle; move engine processes in with ``add_session``), or skips the test with the
reason (not root, no cgroup v1 blkio, no loop devices). Everything is undone on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.throttled_disk import SlowDisk, slow_disk, unavailable

__all__ = ["SlowDisk", "slow_disk_or_skip"]


@contextmanager
def slow_disk_or_skip(folder: Path, size: str = "1G") -> Iterator[SlowDisk]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with slow_disk(folder, size) as disk:
        yield disk
