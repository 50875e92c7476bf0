"""``kvtier.settings``: one parser per component; what kv_transfer_config writes parses back."""

from pathlib import Path

import pytest

import kvtier
from kvtier.errors import ConfigError
from kvtier.settings import (
    DiskTierSettings,
    HostPoolSettings,
    SharedTierSettings,
    parse_tier,
)


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
        ({"root_dir": "/x", "capacity_bytes": "1KiB"}, r"capacity_bytes .*greater than 4096"),
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
    with pytest.raises(ConfigError, match=r"url .*not a redis://"):
        SharedTierSettings.parse({"url": "http://cache:6379"})
    with pytest.raises(ConfigError, match=r"password .*=<hidden>") as refused:
        SharedTierSettings.parse({"url": "redis://h:1", "password": 12345})
    assert "12345" not in str(refused.value)
    shared = SharedTierSettings.parse({"url": "redis://h:1", "password": "s3cret"})
    assert "s3cret" not in repr(shared) and "s3cret" not in str(shared)
    assert SharedTierSettings.parse(shared.to_dict()) == shared
