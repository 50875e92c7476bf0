"""Record files made by hand for the native reader's tests: good ones (written buffered, so
the page cache keeps them), their pages dropped, and the damages a reader must refuse."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier.format.checksum import DEFAULT_ALGORITHM
from kvtier.format.record import HEADER_BYTES, encode_header, make_header


def header_of(payload: bytes, checksum_alg: int = DEFAULT_ALGORITHM.algorithm_id) -> bytes:
    return encode_header(make_header(b"n" * 16, b"k", payload, checksum_alg))


def write_record(
    path: Path, payload: bytes, checksum_alg: int = DEFAULT_ALGORITHM.algorithm_id
) -> None:
    path.write_bytes(header_of(payload, checksum_alg) + payload)
    path.chmod(0o600)


def write_buffered(path: Path, payload: bytes) -> None:
    """A record written through the page cache and fsynced: its pages stay cached, clean."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, header_of(payload) + payload)
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_pages(path: Path) -> None:
    """Ask the kernel to drop the file's clean pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def mount_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (/proc/mounts, longest prefix)."""
    best, kind = "", "unknown"
    resolved = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        point, fs = line.split()[1:3]
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fs
    return kind


def o_direct_folder(folder: Path) -> Path:
    """``folder`` where it takes O_DIRECT, else skip: the tests need a file system with a
    device."""
    probe_file = folder / "o_direct"
    try:
        os.close(os.open(probe_file, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        pytest.skip(f"{folder} ({mount_type(folder)}) refuses O_DIRECT")
    probe_file.unlink()
    return folder


Damage = Callable[[Path], None]


def _symlink(path: Path) -> None:
    target = path.with_suffix(".target")
    path.rename(target)
    path.symlink_to(target)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _group_writable(path: Path) -> None:
    path.chmod(0o620)


def _truncated(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 4096)


def _longer(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"x")


def _missing(path: Path) -> None:
    path.unlink()


def _other_user(path: Path) -> None:
    os.chown(path, 12345, 12345)


#: Each damage and what ``read_checked`` must raise: a CorruptRecordError reason or an errno.
DAMAGES: dict[str, tuple[Damage, str | int]] = {
    "symlink": (_symlink, "symlink"),
    "fifo": (_fifo, "not_regular"),
    "folder": (_folder, "not_regular"),
    "group-writable": (_group_writable, "not_private"),
    "other-user": (_other_user, "not_private"),
    "truncated": (_truncated, "length"),
    "longer": (_longer, "length"),
    "missing": (_missing, errno.ENOENT),
}

assert HEADER_BYTES % 4096 == 0  # _truncated cuts a whole page off the payload
