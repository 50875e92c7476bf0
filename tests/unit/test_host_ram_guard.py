"""The RAM pool is clamped to live available memory, with a floor that scales with the machine."""

import pytest

from kvtier.errors import ConfigError
from kvtier.hostpool.ram_guard import (
    MemorySnapshot,
    check_shm_space,
    clamp_host_pool,
    free_ram_floor,
    read_memory,
)

GiB = 2**30
MiB = 2**20
ROW = 4 * MiB


@pytest.mark.parametrize(
    ("total", "floor"),
    [
        (2 * GiB, 256 * MiB),
        (6 * GiB, int(0.6 * GiB)),
        (24 * GiB, int(2.4 * GiB)),
        (512 * GiB, 4 * GiB),
    ],
)
def test_free_ram_floor_scales_with_the_machine(total, floor):
    assert free_ram_floor(total) == floor


def test_pool_that_fits_is_kept_in_whole_rows():
    clamp = clamp_host_pool(10 * ROW + 1, ROW, MemorySnapshot(24 * GiB, 20 * GiB))
    assert (clamp.rows, clamp.pool_bytes, clamp.clamped) == (10, 10 * ROW, False)
    assert "fits in RAM" in clamp.message


def test_pool_larger_than_spare_ram_is_clamped_and_says_why():
    snapshot = MemorySnapshot(total_bytes=24 * GiB, available_bytes=10 * GiB)
    clamp = clamp_host_pool(32 * GiB, ROW, snapshot)
    floor = free_ram_floor(24 * GiB)
    assert clamp.clamped
    assert clamp.rows == (10 * GiB - floor) // ROW
    assert clamp.message.startswith("kvtier: host pool clamped from 32.00 GiB to 7.60 GiB")
    assert "MemAvailable 10.00 GiB of 24.00 GiB" in clamp.message
    assert "keeping 2.40 GiB free" in clamp.message
    assert "host_pool_dir" in clamp.message


def test_small_ci_runner_keeps_a_usable_budget():
    # 6 GB machine with 2.6 GB available: a fixed multi-GiB floor would zero the budget.
    snapshot = MemorySnapshot(total_bytes=6 * 10**9, available_bytes=int(2.6 * 10**9))
    clamp = clamp_host_pool(2 * GiB, ROW, snapshot)
    assert clamp.pool_bytes > 1.5 * GiB


def test_cgroup_limit_tightens_the_headroom():
    snapshot = MemorySnapshot(
        total_bytes=64 * GiB,
        available_bytes=60 * GiB,
        cgroup_limit_bytes=8 * GiB,
        cgroup_usage_bytes=5 * GiB,
    )
    assert snapshot.headroom_bytes == 3 * GiB
    clamp = clamp_host_pool(4 * GiB, ROW, snapshot)
    assert clamp.pool_bytes == (3 * GiB - free_ram_floor(8 * GiB)) // ROW * ROW
    assert "cgroup limit 8.00 GiB with 5.00 GiB used" in clamp.message


def test_no_room_for_one_row_refuses_and_names_the_disk_backed_pool():
    snapshot = MemorySnapshot(total_bytes=8 * GiB, available_bytes=500 * MiB)
    with pytest.raises(
        ConfigError,
        match=r"no RAM to spare for even one 4.00 MiB row .*"
        r"host_pool_dir='/path/on/local/disk'",
    ):
        clamp_host_pool(2 * GiB, ROW, snapshot)


def test_read_memory_parses_meminfo_and_a_cgroup_v2_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    8192 kB\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("0::/app/worker\n")
    root = tmp_path / "fs"
    (root / "app" / "worker").mkdir(parents=True)
    (root / "app" / "worker" / "memory.max").write_text("max\n")
    (root / "app" / "worker" / "memory.current").write_text(f"{3 * MiB}\n")
    (root / "app" / "memory.max").write_text(f"{10 * MiB}\n")
    snapshot = read_memory(meminfo, proc_cgroup, root)
    assert (snapshot.total_bytes, snapshot.available_bytes) == (16 * MiB, 8 * MiB)
    assert (snapshot.cgroup_limit_bytes, snapshot.cgroup_usage_bytes) == (10 * MiB, 3 * MiB)
    assert snapshot.headroom_bytes == 7 * MiB


def test_read_memory_parses_a_cgroup_v1_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 16384 kB\nMemAvailable: 8192 kB\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("12:cpu,cpuacct:/x\n7:memory:/docker/abc\n")
    folder = tmp_path / "fs" / "memory" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "memory.limit_in_bytes").write_text(f"{4 * MiB}\n")
    (folder / "memory.usage_in_bytes").write_text(f"{1 * MiB}\n")
    snapshot = read_memory(meminfo, proc_cgroup, tmp_path / "fs")
    assert snapshot.headroom_bytes == 3 * MiB


def test_unlimited_cgroup_is_no_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 16384 kB\nMemAvailable: 8192 kB\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("0::/\n")
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "memory.max").write_text("max\n")
    assert read_memory(meminfo, proc_cgroup, tmp_path / "fs").cgroup_limit_bytes is None


def test_live_memory_snapshot_is_plausible():
    snapshot = read_memory()
    assert 0 < snapshot.available_bytes <= snapshot.total_bytes


def test_shm_too_small_for_the_pool_names_the_disk_backed_option(tmp_path):
    with pytest.raises(ConfigError, match=r"does not fit in .* host_pool_dir="):
        check_shm_space(1 << 60, str(tmp_path))


def test_shm_with_room_for_the_pool_passes(tmp_path):
    check_shm_space(4096, str(tmp_path))
