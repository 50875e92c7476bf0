"""The lab's slow disk (``tests.support.throttled_disk``): what the slow-tier engine tests rely on.

Root, cgroup v1 blkio and loop devices are needed; elsewhere these skip with the reason, and the
same tier behaviour is covered through a throttled ``RecordIO`` (tests/faults/test_slow_tier.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.slow_disk import SlowDisk, slow_disk_or_skip

FILE_BYTES = 1 << 20

#: Reads the file with O_DIRECT (as the disk tier does) once told to on stdin.
READER = """
import mmap, os, sys
print("ready", flush=True)
sys.stdin.readline()
buf = mmap.mmap(-1, {size})
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
assert os.preadv(fd, [buf], 0) == {size}
"""


def _write(disk: SlowDisk) -> Path:
    path = disk.mount / "data"
    path.write_bytes(os.urandom(FILE_BYTES))
    os.sync()
    return path


def _read_in_cgroup(disk: SlowDisk, path: Path) -> float:
    """Seconds a process moved into the disk's cgroup takes to read ``path`` directly."""
    child = subprocess.Popen(
        [sys.executable, "-c", READER.format(size=FILE_BYTES), str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        disk.add(child.pid)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        start = time.monotonic()  # the interpreter's start-up is not timed
        child.communicate("go\n", timeout=60)
        assert child.returncode == 0
        return time.monotonic() - start
    finally:
        child.kill()


def test_a_fresh_slow_disk_counts_the_cgroups_reads_before_any_throttle(tmp_path):
    # The kernel sets a device's throttling up only once a rule is written for it; a slow disk
    # that did not would count nothing here (on a device nobody had throttled before).
    with slow_disk_or_skip(tmp_path / "slow", size="64M") as disk:
        path = _write(disk)
        assert disk.bytes_read() == 0
        _read_in_cgroup(disk, path)
        assert disk.bytes_read() >= FILE_BYTES


def test_the_throttle_slows_the_cgroups_direct_reads_and_lifting_it_restores_them(tmp_path):
    with slow_disk_or_skip(tmp_path / "slow", size="64M") as disk:
        path = _write(disk)
        disk.throttle(FILE_BYTES)  # the file in about a second
        throttled_s = _read_in_cgroup(disk, path)
        disk.throttle(None)
        free_s = _read_in_cgroup(disk, path)
        assert throttled_s >= 0.5, f"a throttled read of 1 MiB at 1 MiB/s took {throttled_s:.2f} s"
        assert free_s < throttled_s / 2
