"""``kvtier.settings``: one parser per component; what kv_transfer_config writes parses back."""

from pathlib import Path

import pytest

import kvtier
from kvtier.errors import ConfigError
from kvtier.settings import (
    DISK_MIN_CAPACITY_BYTES,
    DiskTierSettings,
    HostPoolSettings,
    SharedTierSettings,
    parse_tier,
)
from kvtier.store import DiskStore
from tests.support.store import make_namespace


def test_defaults_work_without_any_option():
    pool = HostPoolSettings.parse({})
    assert pool.host_pool_bytes == 2 * 2**30
    assert pool.host_pool_dir is None and pool.allow_small_tiers is False


def test_what_kv_transfer_config_writes_is_what_the_engine_parses(tmp_path):
    config = kvtier.kv_transfer_config(
        host_pool="512MiB",
        host_pool_dir=tmp_path / "pool",
        allow_small_tiers=True,
        disk_dir=tmp_path / "disk",
        disk_capacity="8GiB",
        disk_threads=2,
        fsync="data",
    )
    extra = config["kv_connector_extra_config"]
    pool = HostPoolSettings.from_extra_config(extra)
    assert pool == HostPoolSettings(
        host_pool_bytes=512 * 2**20, host_pool_dir=tmp_path / "pool", allow_small_tiers=True
    )
    (tier,) = extra["secondary_tiers"]
    disk = parse_tier(tier)
    assert disk == DiskTierSettings(
        root_dir=tmp_path / "disk", capacity_bytes=8 * 2**30, io_threads=2, fsync="data"
    )
    assert DiskTierSettings.parse(disk.to_dict()) == disk


def test_settings_are_frozen():
    pool = HostPoolSettings.parse({})
    with pytest.raises(Exception, match="frozen"):
        pool.host_pool_bytes = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"host_pool_bytes": 0}, r"host_pool_bytes \(host_pool / --host-pool\)=0: .*than 0"),
        ({"host_pool_bytes": "lots"}, r"host_pool_bytes \(host_pool / --host-pool\)='lots'"),
        ({"host_pool_bytes": True}, r"host_pool_bytes .*not a size"),
        ({"allow_small_tiers": "yes"}, r"allow_small_tiers .*='yes'.*give true or false"),
        ({"hostpool": 1}, r"unknown host pool option\(s\) \['hostpool'\]; known: \["),
    ],
)
def test_bad_host_pool_values_name_the_field_the_option_and_the_fix(data, match):
    with pytest.raises(ConfigError, match=match):
        HostPoolSettings.parse(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({}, r"root_dir \(disk_dir / --disk-dir\)"),
        ({"root_dir": "/x", "capacity_bytes": "1KiB"}, r"capacity_bytes .*smallest disk cap"),
        ({"root_dir": "/x", "free_space_floor_bytes": -1}, r"free_space_floor_bytes .*=-1: neg"),
        ({"root_dir": "/x", "io_threads": 1.5}, r"io_threads .*whole number"),
        ({"root_dir": "/x", "fsync": "sometimes"}, r"'never' \(default\), 'data' or 'always'"),
    ],
)
def test_bad_disk_values_name_the_field_the_option_and_the_fix(data, match):
    with pytest.raises(ConfigError, match=match):
        DiskTierSettings.parse(data)


def test_relative_folders_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert DiskTierSettings.parse({"root_dir": "cache"}).root_dir == tmp_path / "cache"
    home_pool = HostPoolSettings.parse({"host_pool_dir": "~/p"}).host_pool_dir
    assert home_pool == Path("~/p").expanduser()


def test_a_tier_that_is_not_kvtiers_is_left_to_vllm():
    assert parse_tier({"type": "fs", "root_dir": "/x", "n_read_threads": 4}) is None


def test_shared_tier_url_is_checked_and_its_password_never_shown():
    shown = r"url \(shared / --shared\)='http://cache:6379': has scheme"
    with pytest.raises(ConfigError, match=shown):
        SharedTierSettings.parse({"url": "http://cache:6379"})
    with pytest.raises(ConfigError, match=r"password .*=<hidden>") as refused:
        SharedTierSettings.parse({"url": "redis://h:1", "password": 12345})
    assert "12345" not in str(refused.value)
    shared = SharedTierSettings.parse({"url": "redis://h:1", "password": "s3cret"})
    assert "s3cret" not in repr(shared) and "s3cret" not in str(shared)
    assert SharedTierSettings.parse(shared.to_dict()) == shared


def test_the_store_and_the_settings_share_one_minimum_cap(tmp_path):
    """No cap passes start-up (settings) and fails later when the tier opens its store."""
    smallest = {"root_dir": tmp_path / "a", "capacity_bytes": DISK_MIN_CAPACITY_BYTES}
    assert DiskTierSettings.parse(smallest).capacity_bytes == DISK_MIN_CAPACITY_BYTES
    DiskStore(tmp_path / "a", make_namespace(), DISK_MIN_CAPACITY_BYTES).close()
    below = DISK_MIN_CAPACITY_BYTES - 1
    with pytest.raises(ConfigError, match=r"capacity_bytes \(disk_capacity / --disk-capacity\)"):
        DiskTierSettings.parse({"root_dir": tmp_path / "b", "capacity_bytes": below})
    with pytest.raises(ConfigError, match=f"capacity_bytes={below}"):
        DiskStore(tmp_path / "b", make_namespace(), below)


def test_a_too_small_cap_is_refused_even_when_small_tiers_are_allowed(tmp_path):
    with pytest.raises(ConfigError, match=r"disk_capacity.*smallest disk cap.*give a size"):
        kvtier.kv_transfer_config(disk_dir=tmp_path, disk_capacity="512KiB", allow_small_tiers=True)


def test_settings_built_in_code_raise_the_same_config_error():
    with pytest.raises(ConfigError, match=r"io_threads \(disk_threads / --disk-threads\)=0"):
        DiskTierSettings(root_dir="/x", io_threads=0)


def test_a_shared_url_with_a_password_inside_the_disk_tier_is_never_echoed():
    with pytest.raises(ConfigError, match=r"shared .*=<hidden>: .*retries") as refused:
        DiskTierSettings.parse(
            {"root_dir": "/x", "shared": {"url": "redis://u:s3cret@h:1", "retries": 9}}
        )
    assert "s3cret" not in str(refused.value)
