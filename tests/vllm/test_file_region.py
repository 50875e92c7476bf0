"""The disk-backed host pool: a private sparse file, shared like /dev/shm, never pre-faulted."""

import os
import stat
import uuid

import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.vllm.file_region import (
    FileOffloadRegion,
    check_disk_space,
    clean_stale_pool_files,
    pool_path,
)
from tests.support.mapping import mapped_by_another_process

ROW = 64 * 1024
ROWS = 4096  # a 256 MiB pool


def region(folder, engine_id, rank=0, rows=ROWS):
    return FileOffloadRegion(
        folder,
        engine_id=engine_id,
        num_chunks=rows,
        rank=rank,
        kv_bytes_per_chunk=ROW,
        cpu_page_size=ROW,
    )


@pytest.fixture
def engine_id():
    return f"test-{uuid.uuid4().hex}"


def test_pool_file_is_private_and_sparse(tmp_path, engine_id):
    pool = region(tmp_path, engine_id)
    try:
        st = os.stat(pool_path(tmp_path, engine_id))
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size == ROWS * ROW
        assert st.st_blocks * 512 < 1024 * 1024  # nothing pre-faulted
    finally:
        pool.cleanup()


def test_only_touched_rows_cost_disk_blocks(tmp_path, engine_id):
    pool = region(tmp_path, engine_id)
    try:
        view = pool.create_next_worker_view(ROW)
        view[7].fill_(1)
        view[4000].fill_(2)
        os.fsync(pool.fd)
        assert 2 * ROW <= pool.allocated_bytes() < 16 * ROW
    finally:
        pool.cleanup()


def test_scheduler_mapping_sees_the_workers_bytes(tmp_path, engine_id):
    worker = region(tmp_path, engine_id)
    scheduler = region(tmp_path, engine_id, rank=None)
    try:
        assert not scheduler._creator
        worker.create_next_worker_view(ROW)[3, :5] = 9
        rows = scheduler.create_kv_memoryview()
        assert rows.shape == (ROWS, ROW)
        assert np.asarray(rows)[3, :6].tolist() == [9] * 5 + [0]
        rows.release()
    finally:
        scheduler.cleanup()
        worker.cleanup()


def test_worker_views_follow_upstreams_row_layout(tmp_path, engine_id):
    pool = FileOffloadRegion(
        tmp_path, engine_id, num_chunks=8, rank=1, kv_bytes_per_chunk=8192, cpu_page_size=4096
    )
    try:
        view = pool.create_next_worker_view(4096)
        assert view.shape == (8, 4096)
        assert view.stride() == (8192, 1)
        assert view.storage_offset() == 4096
    finally:
        pool.cleanup()


def test_cleanup_by_the_creator_removes_the_file(tmp_path, engine_id):
    region(tmp_path, engine_id).cleanup()
    assert list(tmp_path.iterdir()) == []


def test_cleanup_by_a_joiner_leaves_the_file_to_its_creator(tmp_path, engine_id):
    creator = region(tmp_path, engine_id)
    region(tmp_path, engine_id, rank=None).cleanup()
    assert pool_path(tmp_path, engine_id).exists()
    creator.cleanup()


def test_pool_larger_than_the_free_disk_space_is_refused_before_any_file_is_left(
    tmp_path, engine_id
):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    with pytest.raises(ConfigError, match=r"does not fit on the file system of host_pool_dir="):
        region(tmp_path, engine_id, rows=free // ROW + 1024)
    assert list(tmp_path.iterdir()) == []


def test_disk_space_check_passes_a_pool_that_fits(tmp_path):
    check_disk_space(tmp_path, 4096)


def test_symlink_in_place_of_the_pool_file_is_not_followed(tmp_path, engine_id):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    pool_path(tmp_path, engine_id).symlink_to(target)
    with pytest.raises(OSError):
        region(tmp_path, engine_id)
    assert target.read_bytes() == b""


def test_pool_file_left_by_a_dead_engine_is_removed(tmp_path, monkeypatch):
    stale = pool_path(tmp_path, "dead")
    stale.write_bytes(b"\0" * 4096)
    monkeypatch.setenv("KVTIER_SHM_MIN_AGE_S", "0")
    assert clean_stale_pool_files(tmp_path) == [stale]


def test_pool_file_mapped_by_a_live_process_is_kept(tmp_path, monkeypatch):
    live = pool_path(tmp_path, "live")
    live.write_bytes(b"\0" * 4096)
    with mapped_by_another_process(live):
        monkeypatch.setenv("KVTIER_SHM_MIN_AGE_S", "0")
        assert clean_stale_pool_files(tmp_path) == []
        assert live.exists()


def test_other_files_in_the_pool_folder_are_never_touched(tmp_path, monkeypatch):
    other = tmp_path / "notes.txt"
    other.write_text("keep")
    monkeypatch.setenv("KVTIER_SHM_MIN_AGE_S", "0")
    assert clean_stale_pool_files(tmp_path) == []
    assert other.exists()
