"""Start-up cleanup removes host pools of dead engines and never touches a live one."""

import os
import time

from kvtier.hostpool.regions import clean_stale_regions
from tests.support.mapping import mapped_by_another_process


def test_region_nobody_holds_is_removed(tmp_path):
    stale = tmp_path / "vllm_offload_dead.mmap"
    stale.write_bytes(b"\0" * 4096)
    assert clean_stale_regions(tmp_path, min_age_s=0) == [stale]
    assert not stale.exists()


def test_young_region_is_kept_even_without_a_visible_holder(tmp_path):
    young = tmp_path / "vllm_offload_new.mmap"
    young.write_bytes(b"\0")
    assert clean_stale_regions(tmp_path, min_age_s=3600) == []
    assert young.exists()


def test_region_held_open_by_a_live_process_is_kept(tmp_path):
    live = tmp_path / "vllm_offload_live.mmap"
    live.write_bytes(b"\0" * 4096)
    with mapped_by_another_process(live):  # mapped, fd closed: maps only
        assert clean_stale_regions(tmp_path, min_age_s=0) == []
        assert live.exists()
    time.sleep(0.1)
    assert clean_stale_regions(tmp_path, min_age_s=0) == [live]


def test_other_files_are_never_touched(tmp_path):
    other = tmp_path / "psm_1234"
    other.write_bytes(b"x")
    clean_stale_regions(tmp_path, min_age_s=0)
    assert other.exists()
    assert os.listdir(tmp_path) == ["psm_1234"]
