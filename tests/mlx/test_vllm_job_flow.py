"""kvtier's MLX worker driven by vLLM's own offloading connector and scheduler.

vLLM 0.32.0's real ``Scheduler`` and ``OffloadingConnector`` scheduler side (with
``KvtierMlxSpec``'s host pool and disk tier) plan store and load jobs; a stub model runner that
owns an MLX paged cache runs them through ``KvtierMlxConnector``'s worker side and reports the
finished jobs back (``tests.mlx.stub_engine``). The stub checks every computed token's KV in the
blocks vLLM assigned before each step, so a restored prefix is checked element by element.
"""

import json

import mlx.core as mx
import pytest

import kvtier.vllm.mlx_worker as mlx_worker
from kvtier.mlx.block_copy import scatter_blocks
from kvtier.mlx.transfer_config import mlx_transfer_config
from tests.mlx.paged_caches import CacheShape
from tests.mlx.stub_engine import KVMismatch, StubEngine, model_folder

SHAPE = CacheShape(num_layers=2, num_blocks=64, block_size=16, kv_heads=2, head_dim=16)
PROMPT = [(i * 37) % 900 + 1 for i in range(100)]  # 6 full blocks and a 4-token tail
FULL_BLOCK_TOKENS = 96


@pytest.fixture
def model(tmp_path):
    return model_folder(tmp_path / "model", SHAPE)


def transfer(tmp_path, layout: str, **options) -> dict:
    return mlx_transfer_config(
        layout,
        "4KiB",  # less than a block of one array: every copy goes one block at a time
        host_pool="8MiB",
        host_pool_dir=str(tmp_path / "pool"),
        allow_small_tiers=True,
        restore_decision=False,
        **options,
    )


def wipe(engine: StubEngine) -> None:
    """Empty the engine's prefix cache and zero its MLX cache: what comes back was restored."""
    assert engine.scheduler.reset_prefix_cache()
    holders = (
        [engine.cache.key_caches, engine.cache.value_caches]
        if engine.layout == "layerwise"
        else [engine.cache.pages]
    )
    for arrays in holders:
        for i, array in enumerate(arrays):
            arrays[i] = mx.zeros_like(array)


@pytest.mark.parametrize("layout", ["layerwise", "pages"])
def test_a_prefix_stored_by_vllms_jobs_is_restored_exactly_from_the_host_pool(
    tmp_path, model, layout
):
    engine = StubEngine(model, layout, SHAPE, transfer(tmp_path, layout))
    try:
        engine.add("cold", PROMPT)
        engine.run()
        assert engine.stores >= 1 and engine.loads == 0
        wipe(engine)
        engine.add("warm", PROMPT)
        engine.run()  # checks the restored KV before computing the tail
        assert engine.first_computed["warm"] == FULL_BLOCK_TOKENS
        assert engine.loads == 1
        assert engine.finished["warm"] == engine.finished["cold"]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("layout", ["layerwise", "pages"])
def test_a_fresh_engine_restores_the_prefix_from_the_disk_tier(tmp_path, model, layout):
    options = transfer(tmp_path, layout, disk_dir=str(tmp_path / "disk"))
    first = StubEngine(model, layout, SHAPE, options)
    try:
        first.add("cold", PROMPT)
        first.run()
    finally:
        first.shutdown()  # drains the disk tier's writes
    fresh = StubEngine(model, layout, SHAPE, options)
    try:
        fresh.add("warm", PROMPT)
        fresh.run()
        assert fresh.first_computed["warm"] == FULL_BLOCK_TOKENS
        assert fresh.finished["warm"] == first.finished["cold"]
    finally:
        fresh.shutdown()


def test_each_layout_keeps_its_records_in_a_namespace_of_its_own(tmp_path, model):
    disk = tmp_path / "disk"
    for layout in ("layerwise", "pages"):
        engine = StubEngine(model, layout, SHAPE, transfer(tmp_path, layout, disk_dir=str(disk)))
        try:
            engine.add("cold", PROMPT)
            engine.run()
        finally:
            engine.shutdown()
    with_records = [p for p in disk.glob("*/namespace.json") if any(p.parent.rglob("*.kvb"))]
    layouts = sorted(json.loads(p.read_text())["extra"]["kv_cache_layout"] for p in with_records)
    assert layouts == ["mlx-layerwise", "mlx-pages"]


def test_one_changed_element_of_restored_kv_fails_the_check(tmp_path, model, monkeypatch):
    """The mutation test: the checks above see a single wrong element in a restored block."""
    engine = StubEngine(model, "layerwise", SHAPE, transfer(tmp_path, "layerwise"))
    try:
        engine.add("cold", PROMPT)
        engine.run()
        wipe(engine)

        def scatter_one_wrong(array, block_ids, rows):
            rows = rows.copy()
            rows[0, 4] ^= 0x01  # one bit of one byte of one element
            return scatter_blocks(array, block_ids, rows)

        monkeypatch.setattr(mlx_worker, "scatter_blocks", scatter_one_wrong)
        engine.add("warm", PROMPT)
        with pytest.raises(KVMismatch, match="layer 0 keys of positions"):
            engine.run()
    finally:
        monkeypatch.undo()
        engine.shutdown()
