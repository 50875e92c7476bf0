"""A really slow disk: ext4 on a loop device whose reads a cgroup v1 ``blkio`` throttle slows.

``slow_disk(folder)`` is a context manager yielding a ``SlowDisk``: a file system mounted at
``folder / "mnt"``, on a loop device, and a blkio cgroup that limits reads from that device
(``blkio.throttle.read_bps_device``) for the processes moved into it (``add``). The limit can
change at any time (``throttle``; ``None`` lifts it). Only I/O to the loop device is slowed;
the rest of a throttled process runs at full speed. Direct-I/O reads are throttled; reads
served from the page cache never reach the device (kvtier's disk tier reads with ``O_DIRECT``).

Everything is undone on exit, whatever happened inside: processes moved back to the root
cgroup, the cgroup removed, the file system unmounted, the loop device detached and removed.

Two kernel facts this rests on (Linux 6.18, cgroup v1): blk-throttle neither throttles nor
*counts* a device's bios until a throttle rule has first been written for that device (its
queue's throttling is set up lazily, then stays set up for the device's lifetime, across
detach and re-attach). So a slow disk writes a no-op rule at once, or ``bytes_read`` reads 0
until the first ``throttle``; and it attaches its image to a loop device of its own, made
for it (``LOOP_CTL_ADD``), so no state of an earlier user of a shared device decides what
it does: every run behaves as on a fresh machine.
(/work/shared/research/slow-tiers.md has the measurements this rests on.)

``unavailable()`` names why this machine cannot do it (not root, no cgroup v1 blkio, no loop
device), or returns None; tests skip with that reason (``tests/support/slow_disk.py``), the
benchmark ``kvtier bench slow-tier`` stops with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BLKIO_ROOT = Path("/sys/fs/cgroup/blkio")
LOOP_CONTROL = "/dev/loop-control"
#: ioctls of /dev/loop-control (linux/loop.h).
_LOOP_CTL_ADD, _LOOP_CTL_REMOVE = 0x4C80, 0x4C81


def unavailable() -> str | None:
    """Why a slow disk cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "a slow disk needs root (loop device, mount, cgroup)"
    if not (BLKIO_ROOT / "blkio.throttle.read_bps_device").exists():
        return f"no cgroup v1 blkio throttling at {BLKIO_ROOT}"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control missing)"
    return None


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def _major_minor(device: str) -> str:
    st = os.stat(device)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (an engine child started with a new session, and
    the EngineCore and worker processes it forks)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.getsid(int(entry.name)) == sid:
                pids.append(int(entry.name))
    return sorted(pids)


@dataclass
class SlowDisk:
    """A mounted loop-device file system and the cgroup that throttles reads from it."""

    mount: Path
    device: str
    cgroup: Path
    #: Read limit now in force, bytes/s (None: unthrottled).
    read_bps: int | None = None
    moved: set[int] = field(default_factory=set)

    @property
    def major_minor(self) -> str:
        return _major_minor(self.device)

    def throttle(self, read_bps: int | None) -> None:
        """Limit reads from the device to ``read_bps`` bytes/s for the cgroup (None: lift)."""
        value = 0 if read_bps is None else int(read_bps)  # 0 removes the rule
        (self.cgroup / "blkio.throttle.read_bps_device").write_text(f"{self.major_minor} {value}\n")
        self.read_bps = read_bps

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads, in cgroup v1) into the throttled cgroup.
        Children it forks later start there too."""
        (self.cgroup / "cgroup.procs").write_text(f"{pid}\n")
        self.moved.add(pid)

    def add_session(self, sid: int) -> list[int]:
        """Move every process of session ``sid`` in; returns their pids."""
        pids = session_pids(sid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                self.add(pid)
        return pids

    def members(self) -> list[int]:
        text = (self.cgroup / "cgroup.procs").read_text()
        return sorted(int(x) for x in text.split())

    def bytes_read(self) -> int:
        """Bytes the cgroup has read from the device so far (its throttle accounting)."""
        total = 0
        want = self.major_minor
        for line in (self.cgroup / "blkio.throttle.io_service_bytes").read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == want and parts[1] == "Read":
                total += int(parts[2])
        return total


@contextlib.contextmanager
def slow_disk(folder: Path, size: str = "1G", name: str | None = None) -> Iterator[SlowDisk]:
    """Make, mount and throttle a slow disk under ``folder``; undo everything on exit."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    folder.mkdir(parents=True, exist_ok=True)
    image, mount = folder / "tier.img", folder / "mnt"
    cgroup = BLKIO_ROOT / (name or f"kvtier-slowdisk-{os.getpid()}-{time.monotonic_ns()}")
    with contextlib.ExitStack() as undo:
        _run("truncate", "-s", size, str(image))
        undo.callback(image.unlink, missing_ok=True)
        device = _new_loop_device()
        undo.callback(_remove_loop_device, device)
        _run("losetup", device, str(image))
        undo.callback(_detach, device)
        _run("mkfs.ext4", "-q", "-F", device)
        mount.mkdir(exist_ok=True)
        _run("mount", device, str(mount))
        undo.callback(_unmount, mount)
        cgroup.mkdir()
        disk = SlowDisk(mount=mount, device=device, cgroup=cgroup)
        undo.callback(_remove_cgroup, disk)
        # A no-op rule sets up the device's throttling: without it the cgroup's read counter
        # stays 0 until the first real throttle (see the module docstring).
        disk.throttle(None)
        yield disk


def _new_loop_device() -> str:
    """A loop device made now (so never used before), e.g. "/dev/loop8"."""
    fd = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    try:
        number = fcntl.ioctl(fd, _LOOP_CTL_ADD, -1)  # -1: the kernel picks an unused number
    finally:
        os.close(fd)
    device = f"/dev/loop{number}"
    deadline = time.monotonic() + 10
    while not os.path.exists(device):  # devtmpfs names it; udev, where present, may lag
        if time.monotonic() > deadline:
            raise RuntimeError(f"{device} was made but did not appear")
        time.sleep(0.05)
    return device


def _remove_loop_device(device: str) -> None:
    """Remove the device made by ``_new_loop_device``; a detach may take a moment to let go
    (EBUSY), after which a device left behind is only a number, harmless."""
    number = int(device.removeprefix("/dev/loop"))
    deadline = time.monotonic() + 5
    while True:
        try:
            fd = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, _LOOP_CTL_REMOVE, number)
            finally:
                os.close(fd)
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


def _remove_cgroup(disk: SlowDisk) -> None:
    """Lift the throttle (a throttled reader finishes at once), move every process still in the
    cgroup back to the root, and remove it."""
    with contextlib.suppress(OSError):
        disk.throttle(None)
    deadline = time.monotonic() + 30
    while True:
        try:
            members = disk.members()
        except OSError:
            return
        for pid in members:
            with contextlib.suppress(OSError):
                (BLKIO_ROOT / "cgroup.procs").write_text(f"{pid}\n")
        try:
            disk.cgroup.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _unmount(mount: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _run("umount", str(mount))
            return
        except subprocess.CalledProcessError:
            if time.monotonic() > deadline:
                _run("umount", "-l", str(mount))  # lazy: still detached from the tree
                return
            time.sleep(0.2)


def _detach(device: str) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        _run("losetup", "-d", device)
