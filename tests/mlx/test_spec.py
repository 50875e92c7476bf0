"""``KvtierMlxSpec``, its settings and its memory budget: what refuses start-up and why."""

import dataclasses
import logging
import uuid

import pytest

from kvtier.errors import ConfigError
from kvtier.hostpool.ram_guard import MemorySnapshot
from kvtier.mlx.memory_budget import clamp_pool_and_staging, decide_pool_rows
from kvtier.mlx.settings import MlxSettings
from kvtier.mlx.transfer_config import mlx_transfer_config
from kvtier.vllm.mlx_spec import LINUX_POOL_DIR, KvtierMlxSpec, default_pool_dir
from tests.mlx.paged_caches import CacheShape, LayerwiseCache
from tests.vllm.test_spec_startup import PAGE, offloading_config

MiB = 2**20
GiB = 2**30


def mlx_config(tmp_path, layout="layerwise", **changes):
    extra = {"mlx": {"kv_layout": layout}, "kvtier": {"host_pool_dir": str(tmp_path / "pool")}}
    config = offloading_config(f"kvtier-mlx-{uuid.uuid4().hex}", 16 * MiB, **extra)
    return dataclasses.replace(config, **changes)


def test_the_layout_is_the_namespaces_kv_layout(tmp_path):
    assert KvtierMlxSpec(mlx_config(tmp_path, "layerwise")).config.kv_cache_layout == (
        "mlx-layerwise"
    )
    assert KvtierMlxSpec(mlx_config(tmp_path, "pages")).config.kv_cache_layout == "mlx-pages"


def test_more_than_one_worker_is_refused(tmp_path):
    config = mlx_config(tmp_path)
    config = dataclasses.replace(
        config, parallel=dataclasses.replace(config.parallel, world_size=2, tp_size=2)
    )
    with pytest.raises(ConfigError, match="runs one worker, but the engine has 2"):
        KvtierMlxSpec(config)


def test_torch_kv_tensors_are_refused_naming_the_connector(tmp_path):
    spec = KvtierMlxSpec(mlx_config(tmp_path))
    with pytest.raises(ConfigError, match="KvtierMlxConnector"):
        spec.get_worker(object())


def test_a_cache_whose_blocks_are_not_the_engines_size_is_refused(tmp_path):
    spec = KvtierMlxSpec(mlx_config(tmp_path))
    cache = LayerwiseCache(
        CacheShape(num_layers=2, num_blocks=8, block_size=4, kv_heads=2, head_dim=8)
    )
    with pytest.raises(ConfigError, match=f"holds 1024 B a block over 4 arrays.*says {PAGE} B"):
        spec.get_mlx_worker(cache)


def test_the_worker_is_built_over_a_cache_of_the_engines_size(tmp_path):
    spec = KvtierMlxSpec(mlx_config(tmp_path))
    # One layer, keys and values: 2 x 128 tokens x 2 heads x 32 dims x fp32 = PAGE bytes.
    shape = CacheShape(num_layers=1, num_blocks=8, block_size=128, kv_heads=2, head_dim=32)
    assert shape.block_bytes == PAGE
    worker = spec.get_mlx_worker(LayerwiseCache(shape))
    try:
        assert worker.block_bytes == PAGE
        assert spec.get_mlx_worker(LayerwiseCache(shape)) is worker  # built once
        assert len(list((tmp_path / "pool").glob("kvtier_pool_*"))) == 1
    finally:
        worker.shutdown()


def test_an_unset_pool_folder_is_ram_on_linux_and_must_be_given_elsewhere():
    assert default_pool_dir("linux") == LINUX_POOL_DIR
    with pytest.raises(ConfigError, match="set host_pool_dir"):
        default_pool_dir("darwin")


def test_settings_refuse_an_unknown_layout_and_unknown_keys():
    with pytest.raises(ConfigError, match=r"kv_layout.*'pages' or 'layerwise'"):
        MlxSettings.parse({"kv_layout": "nhd"})
    with pytest.raises(ConfigError, match=r"unknown MLX data plane option\(s\) \['layout'\]"):
        MlxSettings.parse({"layout": "pages"})
    with pytest.raises(ConfigError, match="give a mapping"):
        MlxSettings.from_extra_config({"mlx": "pages"})
    assert MlxSettings.parse({"staging_bytes": "8MiB"}).staging_bytes == 8 * MiB


def test_the_transfer_config_names_the_mlx_connector_spec_and_settings():
    config = mlx_transfer_config("layerwise", "8MiB", host_pool="1GiB")
    extra = config["kv_connector_extra_config"]
    assert config["kv_connector"] == "KvtierMlxConnector"
    assert config["kv_connector_module_path"] == "kvtier.vllm.mlx_connector"
    assert (extra["spec_name"], extra["spec_module_path"]) == (
        "KvtierMlxSpec",
        "kvtier.vllm.mlx_spec",
    )
    assert extra["mlx"] == {"kv_layout": "layerwise", "staging_bytes": 8 * MiB}


SNAPSHOT = MemorySnapshot(total_bytes=16 * GiB, available_bytes=4 * GiB)


def test_the_staging_counts_against_the_pool():
    floor = 1 * GiB  # budget 3 GiB
    alone = clamp_pool_and_staging(3 * 1024, MiB, 1, SNAPSHOT, floor)
    assert alone.rows == 3 * 1024 - 1 and alone.clamped  # 2 B of staging cost one row
    with_staging = clamp_pool_and_staging(3 * 1024, MiB, 256 * MiB, SNAPSHOT, floor)
    assert with_staging.rows == 3 * 1024 - 512 and with_staging.clamped
    assert "512.00 MiB of MLX staging" in with_staging.message
    fits = clamp_pool_and_staging(1024, MiB, 256 * MiB, SNAPSHOT, floor)
    assert fits.rows == 1024 and not fits.clamped


def test_no_room_beside_the_staging_refuses_naming_staging_bytes():
    with pytest.raises(ConfigError, match="lower staging_bytes or host_pool"):
        clamp_pool_and_staging(10, MiB, 2 * GiB, SNAPSHOT, 1 * GiB)


def test_memory_that_cannot_be_read_leaves_the_pool_unclamped_with_a_warning(caplog, monkeypatch):
    def unreadable() -> MemorySnapshot:
        raise FileNotFoundError("/proc/meminfo")

    monkeypatch.setattr(logging.getLogger("kvtier"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        assert decide_pool_rows(100, MiB, MiB, unreadable) == 100
    assert "not checked against RAM" in caplog.text


def test_readable_memory_clamps_the_pool():
    assert decide_pool_rows(10**9, MiB, MiB, lambda: SNAPSHOT) < 4 * 1024
