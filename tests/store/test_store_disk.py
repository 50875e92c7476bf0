"""DiskStore behaviour beyond the shared contract: persistence, sharing, pinning, floors."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier import native
from kvtier.errors import ConfigError, KvtierError
from kvtier.format import HEADER_BYTES
from kvtier.store import (
    DiskStore,
    RecordIO,
    RecordReader,
    RecordWriter,
    list_namespaces,
    remove_namespace,
)
from kvtier.store.disk.io import set_background_io_priority
from tests.support.store import (
    PAYLOAD_BYTES,
    aligned_buffer,
    files_under,
    key_of,
    make_namespace,
)
from tests.support.store import payload_of as payload

OpenDisk = Callable[..., DiskStore]
RECORD = HEADER_BYTES + PAYLOAD_BYTES


def test_records_persist_across_reopen(open_disk: OpenDisk) -> None:
    store = open_disk()
    for i in range(3):
        store.put(key_of(i), payload(i))
    store.close()
    again = open_disk()
    assert sorted(again.keys()) == [key_of(i) for i in range(3)]
    assert again.used_bytes() == 3 * RECORD
    assert all(again.get(key_of(i)) == payload(i) for i in range(3))


def test_refresh_picks_up_other_writers_puts_and_deletes(open_disk: OpenDisk) -> None:
    mine, theirs = open_disk(), open_disk()
    theirs.put(key_of(1), payload(1))
    theirs.put(key_of(2), payload(2))
    assert not mine.contains(key_of(1))
    assert mine.refresh() == 2
    assert mine.get(key_of(1)) == payload(1)
    theirs.delete(key_of(1))
    theirs.put(key_of(2), payload(3))
    mine.refresh()
    assert not mine.contains(key_of(1))
    assert mine.get(key_of(2)) == payload(3)
    assert mine.refresh() == 0


def test_load_of_record_another_writer_evicted_is_clean_miss(open_disk: OpenDisk) -> None:
    mine, theirs = open_disk(records=2), open_disk(records=2)
    mine.put(key_of(1), payload(1))
    theirs.put(key_of(2), payload(2))
    theirs.put(key_of(3), payload(3))  # evicts key 1, the least recently used
    assert mine.contains(key_of(1))
    assert mine.get(key_of(1)) is None
    assert not mine.contains(key_of(1))
    assert mine.stats().corrupt == {} and mine.stats().misses == 1


def test_a_record_deleted_by_hand_leaves_the_index_and_stays_a_miss(open_disk: OpenDisk) -> None:
    """Regression: the row of a file deleted behind the store's back stayed in the index, so
    its bytes stayed charged and the next refresh (which replays this process's own commits)
    offered the key again."""
    store = open_disk()
    store.put(key_of(1), payload(1))
    store.put(key_of(2), payload(2))
    used = store.used_bytes()
    path = store.record_path(key_of(1))
    assert path is not None
    path.unlink()
    assert store.get(key_of(1)) is None
    store.refresh()
    assert not store.contains(key_of(1))
    assert store.used_bytes() == used - (HEADER_BYTES + len(payload(1)))
    assert store.verify() == []
    assert store.stats().corrupt == {} and store.get(key_of(2)) == payload(2)


class PausingReader(RecordReader):
    """Pauses reads of one key until released (a slow read in flight)."""

    def __init__(self, key: bytes) -> None:
        super().__init__()
        self.key_hex = key.hex()
        self.reading = threading.Event()
        self.release = threading.Event()

    def read_into(self, path: Path, out: memoryview) -> memoryview:
        if path.name.startswith(self.key_hex):
            self.reading.set()
            assert self.release.wait(30)
        return super().read_into(path, out)


def test_key_being_read_is_not_evicted(open_disk: OpenDisk) -> None:
    io = PausingReader(key_of(0))
    store = open_disk(records=2, io=RecordIO(reader=io), low_watermark=1.0)
    store.put(key_of(0), payload(0))
    store.put(key_of(1), payload(1))
    result: list[bool] = []
    reader = threading.Thread(
        target=lambda: result.append(store.get_into(key_of(0), aligned_buffer(PAYLOAD_BYTES)))
    )
    reader.start()
    assert io.reading.wait(30)
    assert store.put(key_of(2), payload(2))  # key 0 is the LRU, but pinned
    io.release.set()
    reader.join()
    assert result == [True]
    assert store.contains(key_of(0)) and not store.contains(key_of(1))


def test_put_that_would_break_the_free_space_floor_is_refused(open_disk: OpenDisk) -> None:
    store = open_disk()
    store.put(key_of(1), payload(1))
    st = os.statvfs(store.namespace_dir)
    store.free_space_floor_bytes = st.f_bavail * st.f_frsize + (1 << 40)
    assert not store.put(key_of(2), payload(2))
    assert store.get(key_of(1)) == payload(1)


def test_floor_is_restored_by_evicting(open_disk: OpenDisk) -> None:
    store = open_disk()
    for i in range(4):
        store.put(key_of(i), payload(i))
    st = os.statvfs(store.namespace_dir)
    store.free_space_floor_bytes = st.f_bavail * st.f_frsize - RECORD + 2 * RECORD
    assert store.put(key_of(9), payload(9))
    assert store.stats().evictions >= 1
    assert store.contains(key_of(9))


def test_default_floor_scales_with_the_file_system(open_disk: OpenDisk) -> None:
    store = open_disk(free_space_floor_bytes=None)
    st = os.statvfs(store.namespace_dir)
    assert store.free_space_floor_bytes == min(st.f_blocks * st.f_frsize // 20, 10 << 30)


def test_folder_of_another_namespace_json_is_refused(open_disk: OpenDisk) -> None:
    store = open_disk()
    store.close()
    (store.namespace_dir / "namespace.json").write_text(make_namespace("other").to_json())
    with pytest.raises(ConfigError, match="remove the folder"):
        open_disk()


def test_list_and_remove_namespaces(root: Path, open_disk: OpenDisk) -> None:
    first = open_disk()
    first.put(key_of(1), payload(1))
    second = open_disk(namespace=make_namespace("other"))
    listed = {u.digest_hex: u for u in list_namespaces(root)}
    assert listed[first.namespace.digest_hex()].namespace == first.namespace
    assert listed[first.namespace.digest_hex()].used_bytes == RECORD
    assert listed[second.namespace.digest_hex()].used_bytes == 0
    with pytest.raises(KvtierError, match="open by a running store"):
        remove_namespace(root, first.namespace.digest_hex())
    first.close()
    assert remove_namespace(root, first.namespace.digest_hex()) == RECORD
    assert [u.digest_hex for u in list_namespaces(root)] == [second.namespace.digest_hex()]
    with pytest.raises(ConfigError, match="not a 32-digit hex digest"):
        remove_namespace(root, "../etc")


class NoDirectReader(RecordReader):
    """A file system that refuses O_DIRECT opens."""

    def __init__(self) -> None:
        super().__init__(direct_reads=True)
        self.direct_attempts = 0

    def open_for_read(self, path: Path, direct: bool) -> int:
        if direct:
            self.direct_attempts += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().open_for_read(path, direct)


def test_refused_direct_reads_fall_back_once_with_a_warning(
    open_disk: OpenDisk, caplog: pytest.LogCaptureFixture
) -> None:
    io = NoDirectReader()
    store = open_disk(io=RecordIO(reader=io))
    for i in range(3):
        store.put(key_of(i), payload(i))
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            assert store.get_into(key_of(i), aligned_buffer(PAYLOAD_BYTES))
    assert io.direct_attempts == 1
    assert "O_DIRECT reads refused" in caplog.text


def test_damaged_index_is_replaced_by_an_empty_one(open_disk: OpenDisk) -> None:
    store = open_disk()
    store.put(key_of(1), payload(1))
    store.close()
    for suffix in ("-wal", "-shm"):
        (store.namespace_dir / f"index.sqlite3{suffix}").unlink(missing_ok=True)
    (store.namespace_dir / "index.sqlite3").write_bytes(b"not a database" * 512)
    again = open_disk()
    assert list(again.keys()) == [] and again.used_bytes() == 0
    assert files_under(again.namespace_dir / "blocks") == []
    assert again.put(key_of(1), payload(1)) and again.verify() == []


def test_stats_count_puts_hits_and_bytes(open_disk: OpenDisk) -> None:
    store = open_disk()
    store.put(key_of(1), payload(1))
    store.get(key_of(1))
    store.get(key_of(2))
    stats = store.stats()
    assert (stats.puts, stats.hits, stats.misses) == (1, 1, 1)
    assert (stats.bytes_written, stats.bytes_read) == (RECORD, PAYLOAD_BYTES)


@pytest.mark.skipif(native.record_reader() is None, reason="the native reader is not built")
def test_stats_count_hits_copied_from_the_page_cache(open_disk: OpenDisk) -> None:
    """Records written through the page cache (kept there: fsynced, not dropped) are read from
    it; records written O_DIRECT are not in it (unless the file system keeps every file in
    memory) and come from the device."""
    buffered = RecordIO(RecordWriter(fsync="data", direct_writes=False, drop_written_pages=False))
    store = open_disk(io=buffered)
    row = aligned_buffer(PAYLOAD_BYTES)
    row[:] = payload(1)
    assert store.put(key_of(1), row)
    if not native.resident(store.record_path(key_of(1))):
        pytest.skip("the page cache did not keep the buffered write (memory pressure?)")
    assert store.get_into(key_of(1), aligned_buffer(PAYLOAD_BYTES))
    assert (store.stats().hits, store.stats().page_cache_hits) == (1, 1)
    store.close()
    direct = open_disk()
    assert direct.put(key_of(2), row)
    held = native.resident(direct.record_path(key_of(2)))
    assert direct.get_into(key_of(2), aligned_buffer(PAYLOAD_BYTES))
    assert (direct.stats().hits, direct.stats().page_cache_hits) == (1, int(bool(held)))


def test_open_with_many_records_is_fast(open_disk: OpenDisk) -> None:
    store = open_disk(records=600)
    small = b"x" * 16
    for i in range(500):
        store.put(key_of(i), small)
    store.close()
    start = time.perf_counter()
    again = open_disk(records=600)
    assert time.perf_counter() - start < 0.5
    assert len(list(again.keys())) == 500


def test_background_io_priority_applies_to_the_calling_thread() -> None:
    seen: list[tuple[bool, int]] = []

    def worker() -> None:
        ok = set_background_io_priority()
        libc = ctypes.CDLL(None, use_errno=True)
        seen.append((ok, libc.syscall(252, 1, 0)))  # ioprio_get(IOPRIO_WHO_PROCESS, self)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [(True, (2 << 13) | 7)]


def test_page_aligned_payload_round_trips_through_direct_writes(open_disk: OpenDisk) -> None:
    store = open_disk()
    row = aligned_buffer(PAYLOAD_BYTES)
    row[:] = payload(5)
    assert store.put(key_of(5), row)
    assert store.get(key_of(5)) == payload(5)


class NoDirectWriter(RecordWriter):
    """A file system that refuses O_DIRECT writes."""

    def __init__(self) -> None:
        super().__init__()
        self.direct_attempts = 0

    def write_file(self, path: Path, header: object, payload: memoryview, direct: bool) -> None:
        if direct:
            self.direct_attempts += 1
            path.write_bytes(b"")  # as an open that creates the file before refusing
            raise OSError(errno.EINVAL, "Invalid argument")
        super().write_file(path, header, payload, direct)  # type: ignore[arg-type]


def test_refused_direct_writes_fall_back_once_with_a_warning(
    open_disk: OpenDisk, caplog: pytest.LogCaptureFixture
) -> None:
    io = NoDirectWriter()
    store = open_disk(io=RecordIO(io))
    row = aligned_buffer(PAYLOAD_BYTES)
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            row[:] = payload(i)
            assert store.put(key_of(i), row)
    assert io.direct_attempts == 1
    assert "O_DIRECT writes refused" in caplog.text
    assert all(store.get(key_of(i)) == payload(i) for i in range(3))


def test_put_of_an_empty_payload_fails_and_commits_nothing(open_disk: OpenDisk) -> None:
    store = open_disk()
    assert not store.put(key_of(1), b"")
    assert not store.contains(key_of(1)) and store.stats().put_failures == 1
    assert files_under(store.namespace_dir / "blocks") == []
    assert store.used_bytes() == 0
    assert store.put(key_of(1), payload(1)) and store.get(key_of(1)) == payload(1)


def du_bytes(root: Path) -> int:
    """``du -s``: allocated bytes of everything under ``root``, folders and ``root`` included."""
    total = os.lstat(root).st_blocks * 512
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def test_the_cap_bounds_du_of_the_folder_its_folders_included(
    open_disk: OpenDisk, root: Path
) -> None:
    # 256 keys, one per fan-out folder: 1 MiB of folders in a cap of 120 small records.
    store = open_disk(records=120)
    peak = 0
    for i in range(256):
        assert store.put(bytes([i]) + key_of(i)[1:], payload(i))
        peak = max(peak, du_bytes(root))
    assert peak <= store.capacity_bytes, (peak, store.capacity_bytes)
    assert store.stats().evictions > 0
    assert store.footprint_bytes() <= store.capacity_bytes
    assert store.footprint_bytes() >= du_bytes(root) - 4096  # session lock files aside
