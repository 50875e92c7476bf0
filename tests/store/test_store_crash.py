"""A crash at any step of a put leaves a store that opens clean, within its cap.

Crashes are real: a spawned process dies with ``os._exit`` at the chosen step (see
tests.support.crash.CrashingWriter), so its session lock is released by the kernel as in production.
"""

from __future__ import annotations

import errno
import multiprocessing
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier.format import HEADER_BYTES
from kvtier.format.checksum import Buffer
from kvtier.store import DiskStore, RecordWriter
from tests.support.crash import (
    CAPACITY_RECORDS,
    CRASH_EXIT_CODE,
    fill_then_crash,
    open_store,
)
from tests.support.store import PAYLOAD_BYTES, files_under, key_of, payload_of

RECORD = HEADER_BYTES + PAYLOAD_BYTES


def crash(root: Path, at: str, prefill: int = 0) -> None:
    process = multiprocessing.get_context("spawn").Process(
        target=fill_then_crash, args=(str(root), at, prefill)
    )
    process.start()
    process.join(60)
    assert process.exitcode == CRASH_EXIT_CODE


def namespace_dir(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    return folder


def test_get_after_crash_before_rename_is_miss_and_temp_is_cleaned(root: Path) -> None:
    crash(root, "after_temp_write")
    assert files_under(namespace_dir(root) / "tmp") != []
    with open_store(str(root)) as store:
        assert not store.contains(key_of(1))
        assert store.get(key_of(1)) is None
        assert files_under(store.namespace_dir / "tmp") == []
        assert store.used_bytes() == 0
        assert store.verify() == []


def test_crash_after_rename_before_commit_is_reclaimed_at_open(root: Path) -> None:
    crash(root, "after_rename")
    assert len(files_under(namespace_dir(root) / "blocks")) == 1
    with open_store(str(root)) as store:
        assert not store.contains(key_of(1))
        assert files_under(store.namespace_dir / "blocks") == []
        assert store.used_bytes() == 0
        assert store.verify() == []


def test_pending_reservation_of_dead_writer_is_reclaimed_at_open(root: Path) -> None:
    crash(root, "before_write", prefill=2)
    with open_store(str(root)) as store:
        assert store.used_bytes() == 2 * RECORD
        assert sorted(store.keys()) == [key_of(100), key_of(101)]
        assert store.verify() == []


def test_dead_writer_is_reclaimed_by_refresh_of_a_running_store(root: Path) -> None:
    with open_store(str(root)) as running:
        crash(root, "before_write")
        assert running.used_bytes() == RECORD
        running.refresh()
        assert running.used_bytes() == 0
        assert running.verify() == []


def test_crash_between_eviction_and_unlink_frees_files_at_open(root: Path) -> None:
    crash(root, "before_evict_unlink", prefill=CAPACITY_RECORDS)
    with open_store(str(root)) as store:
        on_disk = sum(p.stat().st_size for p in files_under(store.namespace_dir / "blocks"))
        assert on_disk == store.used_bytes() <= CAPACITY_RECORDS * RECORD
        assert store.verify() == []


def test_orphan_file_is_found_by_verify_and_removed(open_disk: Callable[..., DiskStore]) -> None:
    store = open_disk()
    store.put(key_of(1), payload_of(1))
    path = store.record_path(key_of(1))
    assert path is not None
    orphan = path.with_name(path.name.replace(".1.kvb", ".99.kvb"))
    shutil.copyfile(path, orphan)
    problems = store.verify()
    assert [(p.kind, p.key) for p in problems] == [("orphan_file", key_of(1))]
    assert all(p.fixed for p in store.verify(fix=True))
    assert not orphan.exists() and path.exists()
    assert store.verify() == []


class BlockingWriter(RecordWriter):
    """Holds every write until ``release`` is set (a slow writer that is alive)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()

    def write_temp(self, path: Path, header: bytes, payload: Buffer) -> None:
        super().write_temp(path, header, payload)
        self.writing.set()
        assert self.release.wait(30)


def test_open_keeps_the_reservation_and_temp_file_of_a_live_writer(root: Path) -> None:
    io = BlockingWriter()
    with open_store(str(root), io) as writer:
        thread = threading.Thread(target=writer.put, args=(key_of(1), payload_of(1)))
        thread.start()
        assert io.writing.wait(30)
        with open_store(str(root)) as other:
            assert other.used_bytes() == RECORD
            assert len(files_under(other.namespace_dir / "tmp")) == 1
            io.release.set()
            thread.join()
            assert other.refresh() >= 1
            assert other.get(key_of(1)) == payload_of(1)


class NoSpaceWriter(RecordWriter):
    def write_temp(self, path: Path, header: bytes, payload: Buffer) -> None:
        path.write_bytes(header)  # a partial file, as a full disk leaves one
        path.unlink()
        raise OSError(errno.ENOSPC, "No space left on device")


def test_put_on_full_disk_returns_false_and_keeps_old_record(root: Path) -> None:
    with open_store(str(root)) as store:
        store.put(key_of(1), payload_of(1))
    with open_store(str(root), NoSpaceWriter()) as store:
        assert not store.put(key_of(1), payload_of(2))
        assert not store.put(key_of(2), payload_of(2))
        assert store.stats().put_failures == 2
        assert store.used_bytes() == RECORD
        assert store.get(key_of(1)) == payload_of(1)
        assert files_under(store.namespace_dir / "tmp") == []
        assert store.verify() == []


class TornWriter(RecordWriter):
    """Claims success but leaves half the payload unwritten (a power cut with fsync=never)."""

    def write_temp(self, path: Path, header: bytes, payload: Buffer) -> None:
        torn = bytearray(memoryview(payload).cast("B"))
        torn[len(torn) // 2 :] = bytes(len(torn) - len(torn) // 2)
        super().write_temp(path, header, torn)


def test_torn_write_is_caught_by_checksum_on_load(root: Path) -> None:
    with open_store(str(root), TornWriter()) as store:
        assert store.put(key_of(1), payload_of(1))
        assert store.get(key_of(1)) is None
        assert store.stats().corrupt == {"checksum": 1}


@pytest.mark.parametrize("policy", ["never", "data", "always"])
def test_every_fsync_policy_round_trips(root: Path, policy: str) -> None:
    with open_store(str(root), RecordWriter(fsync=policy)) as store:
        assert store.put(key_of(1), payload_of(1))
        assert store.get(key_of(1)) == payload_of(1)
