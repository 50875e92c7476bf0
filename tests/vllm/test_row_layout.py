"""Records that cross tensor-parallel sizes where the ranks hold the same KV slices, no engine.

The namespace names the head slices a record holds (``kvtier.runtime.row_layout``), not the world
size and rank: engines whose ranks hold equal slices share records; other slices, other
layouts (pipeline parallel) and other per-block layouts get another namespace, a clean miss.
"""

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

from kvtier.format import Namespace
from kvtier.runtime.row_layout import RowLayout, head_slices
from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.engine_namespace import build_namespace, engine_row_layout
from tests.vllm.test_disk_tier import run

#: One worker's bytes of a row (one block of one KV tensor per worker in these configs).
WORKER_BYTES = 4096
PAGE = 4096
CTX = ReqContext(req_id="r")


def model_dir(root: Path, kv_heads: int, latent: bool = False) -> Path:
    folder = root / f"model-{kv_heads}{'-mla' if latent else ''}"
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "head_dim": 32,
    }
    if latent:
        config["kv_lora_rank"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def engine_config(
    model: Path, tp: int, pp: int = 1, rank: int = 0, worker_bytes: int = WORKER_BYTES
) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(128, ("layer.0", "layer.1"), 0),),
        worker_kv_bytes_per_block=worker_bytes,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="test",
        model=OffloadingModelConfig(name=str(model), dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=128, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank, tp * pp, tp, pp, 1, 1, 0, 1, None, False),
    )


def pool_row_bytes(config: OffloadingConfig, replicated: bool = False) -> int:
    copies = 1 if replicated else config.parallel.world_size
    return -(-copies * config.worker_kv_bytes_per_block // PAGE) * PAGE


def layout(config: OffloadingConfig, replicated: bool = False) -> RowLayout:
    return engine_row_layout(config, replicated, pool_row_bytes(config, replicated))


def namespace(config: OffloadingConfig, replicated: bool = False) -> Namespace:
    return build_namespace(config, layout(config, replicated))


@pytest.fixture(autouse=True)
def seeded_hashes():
    init_none_hash(sha256)


# -- which rank holds which heads --------------------------------------------------------------
def test_ranks_split_heads_evenly_when_there_are_at_least_as_many_heads_as_ranks():
    assert head_slices(4, 2, latent=False) == ["kv heads 0-2 of 4", "kv heads 2-4 of 4"]
    assert head_slices(2, 1, latent=False) == ["kv heads 0-2 of 2"]


def test_ranks_replicate_heads_when_there_are_fewer_heads_than_ranks():
    assert head_slices(2, 4, latent=False) == ["kv heads 0-1 of 2"] * 2 + ["kv heads 1-2 of 2"] * 2
    assert head_slices(1, 2, latent=False) == ["kv heads 0-1 of 1"] * 2


def test_heads_that_do_not_divide_the_ranks_are_not_named():
    assert head_slices(3, 2, latent=False) is None
    assert head_slices(2, 3, latent=False) is None
    assert head_slices(0, 2, latent=False) is None


# -- namespaces --------------------------------------------------------------------------------
def test_one_kv_head_gives_every_tp_size_the_same_namespace(tmp_path):
    model = model_dir(tmp_path, kv_heads=1)
    tp1, tp2, tp4 = (namespace(engine_config(model, tp)) for tp in (1, 2, 4))
    assert tp1 == tp2 == tp4
    assert tp1.block_bytes == WORKER_BYTES, "the record holds one copy of the head"
    assert layout(engine_config(model, 4)).segment_slices == (0, 0, 0, 0)


def test_tp2_and_tp4_of_two_kv_heads_share_a_namespace(tmp_path):
    model = model_dir(tmp_path, kv_heads=2)
    tp2, tp4 = namespace(engine_config(model, 2)), namespace(engine_config(model, 4))
    assert tp2 == tp4
    assert layout(engine_config(model, 4)).segment_slices == (0, 0, 1, 1)
    assert tp2.block_bytes == 2 * WORKER_BYTES


def test_tp1_of_two_kv_heads_holds_another_slice_than_tp2(tmp_path):
    model = model_dir(tmp_path, kv_heads=2)
    # TP=1 holds heads 0-1 in one page: a 2-head worker part, so its bytes per worker differ
    # too; even with equal bytes the slice alone tells the namespaces apart.
    tp1 = namespace(engine_config(model, 1, worker_bytes=2 * WORKER_BYTES))
    tp1_same_bytes = namespace(engine_config(model, 1, worker_bytes=2 * WORKER_BYTES))
    tp2 = namespace(engine_config(model, 2))
    assert tp1 == tp1_same_bytes
    assert tp1 != tp2 and tp1.digest() != tp2.digest()
    assert tp1.extra["kv_slices"] == "kv heads 0-2 of 2"
    assert tp2.extra["kv_slices"] == "kv heads 0-1 of 2 | kv heads 1-2 of 2"


def test_equal_slices_with_another_per_block_layout_are_another_namespace(tmp_path):
    model = model_dir(tmp_path, kv_heads=1)
    base = engine_config(model, 2)
    other_block = replace(base, groups=(OffloadingGroupConfig(64, ("layer.0", "layer.1"), 0),))
    other_dtype = replace(base, model=OffloadingModelConfig(name=str(model), dtype="bfloat16"))
    other_bytes = engine_config(model, 2, worker_bytes=2 * WORKER_BYTES)
    names = {namespace(c) for c in (base, other_block, other_dtype, other_bytes)}
    assert len(names) == 4


def test_pipeline_parallel_stays_distinct(tmp_path):
    model = model_dir(tmp_path, kv_heads=1)
    tp2 = namespace(engine_config(model, 2))
    pp2 = namespace(engine_config(model, 1, pp=2))
    tp2_pp2 = namespace(engine_config(model, 2, pp=2))
    assert len({tp2, pp2, tp2_pp2}) == 3
    # Pipeline stages hold different layers: every worker is its own slice, by rank.
    assert layout(engine_config(model, 1, pp=2)).segment_slices == (0, 1)


def test_the_namespace_is_the_same_on_every_rank(tmp_path):
    model = model_dir(tmp_path, kv_heads=2)
    assert namespace(engine_config(model, 4, rank=0)) == namespace(engine_config(model, 4, rank=3))


def test_an_unknown_head_count_crosses_no_tp_size(tmp_path):
    model = tmp_path / "not-local"  # no config.json: heads unknown
    tp1, tp2 = namespace(engine_config(model, 1)), namespace(engine_config(model, 2))
    assert tp1 != tp2
    assert layout(engine_config(model, 2)).segment_slices == (0, 1)


def test_an_mla_latent_is_one_slice_on_every_rank_replicated_or_not(tmp_path):
    model = model_dir(tmp_path, kv_heads=1, latent=True)
    tp1 = namespace(engine_config(model, 1))
    tp2_single_copy = namespace(engine_config(model, 2), replicated=True)
    tp4_every_rank = namespace(engine_config(model, 4))
    assert tp1 == tp2_single_copy == tp4_every_rank
    assert tp1.extra["kv_slices"] == "latent"
    assert tp1 != namespace(engine_config(model_dir(tmp_path, kv_heads=1), 1))


def test_a_replicated_row_of_different_slices_is_not_named_by_heads(tmp_path):
    # vLLM keeps one copy only for MLA; a single copy of a headed model cannot be one slice.
    model = model_dir(tmp_path, kv_heads=2)
    assert layout(engine_config(model, 2), replicated=True).slices[0].startswith("rank 0 of 2")


# -- rows and records --------------------------------------------------------------------------
def test_gather_then_scatter_restores_every_rank_part():
    row_layout = RowLayout(4, (0, 0, 1, 1), ("a", "b"))
    row = bytearray(b"AAAAAAAABBBBBBBBpad!")
    record = bytearray(row_layout.record_bytes)
    row_layout.gather(memoryview(row), memoryview(record))
    assert bytes(record) == b"AAAABBBB"
    other = bytearray(len(row))
    row_layout.scatter(memoryview(record), memoryview(other))
    assert bytes(other[:16]) == b"AAAAAAAABBBBBBBB"


# -- disk tiers of different TP sizes on one folder ------------------------------------------
def make_tier(config: OffloadingConfig, disk: Path, rows: int = 4):
    pool = np.zeros((rows, pool_row_bytes(config)), dtype=np.int8)
    spec = SimpleNamespace(config=config, replicated_layout=False)
    tier = KvtierDiskTier(
        spec, memoryview(pool), "KvtierDiskTier", root_dir=str(disk), capacity_bytes="16MiB"
    )
    deadline = time.monotonic() + 30
    while tier.lookup(b"\x63" * 36, CTX) is LookupResult.RETRY:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return tier, pool


KEY = b"\x01" * 32 + (0).to_bytes(4, "big")


def part(pool: np.ndarray, row: int, worker: int) -> np.ndarray:
    return pool[row, worker * WORKER_BYTES : (worker + 1) * WORKER_BYTES]


def test_a_tp4_record_of_two_heads_loads_into_both_ranks_of_tp2(tmp_path):
    model = model_dir(tmp_path, kv_heads=2)
    tp4, pool4 = make_tier(engine_config(model, 4), tmp_path / "disk")
    head0 = np.arange(WORKER_BYTES) % 101
    head1 = np.arange(WORKER_BYTES) % 89 - 40
    for worker, data in enumerate((head0, head0, head1, head1)):
        part(pool4, 0, worker)[:] = data
    try:
        assert run(tp4, 1, [KEY], [0], False).success
    finally:
        tp4.shutdown()
    tp2, pool2 = make_tier(engine_config(model, 2), tmp_path / "disk")
    try:
        assert tp2.lookup(KEY, CTX) is LookupResult.HIT
        result = run(tp2, 2, [KEY], [3], True)
        assert result.success and result.transfer_bytes == 2 * WORKER_BYTES
    finally:
        tp2.shutdown()
    assert np.array_equal(part(pool2, 3, 0), head0) and np.array_equal(part(pool2, 3, 1), head1)


def test_a_tp1_record_of_one_head_loads_into_every_rank_of_tp2(tmp_path):
    model = model_dir(tmp_path, kv_heads=1)
    tp1, pool1 = make_tier(engine_config(model, 1), tmp_path / "disk")
    pool1[0, :WORKER_BYTES] = np.arange(WORKER_BYTES) % 113
    try:
        assert run(tp1, 1, [KEY], [0], False).success
    finally:
        tp1.shutdown()
    tp2, pool2 = make_tier(engine_config(model, 2), tmp_path / "disk")
    try:
        assert run(tp2, 2, [KEY], [1], True).success
    finally:
        tp2.shutdown()
    for worker in (0, 1):
        assert np.array_equal(part(pool2, 1, worker), pool1[0, :WORKER_BYTES])


def test_tp2_of_two_heads_misses_what_tp1_stored(tmp_path):
    model = model_dir(tmp_path, kv_heads=2)
    tp1, pool1 = make_tier(engine_config(model, 1, worker_bytes=2 * WORKER_BYTES), tmp_path / "d")
    pool1[0] = 7
    try:
        assert run(tp1, 1, [KEY], [0], False).success
    finally:
        tp1.shutdown()
    tp2, _ = make_tier(engine_config(model, 2), tmp_path / "d")
    try:
        assert tp2.lookup(KEY, CTX) is LookupResult.MISS
    finally:
        tp2.shutdown()


def test_rows_whose_slots_may_not_follow_the_tp_rank_cross_nothing(tmp_path):
    model = model_dir(tmp_path, kv_heads=1)
    tp1, tp2 = engine_config(model, 1), engine_config(model, 2)
    by_rank = [
        build_namespace(c, engine_row_layout(c, False, pool_row_bytes(c), by_heads=False))
        for c in (tp1, tp2)
    ]
    assert by_rank[0] != by_rank[1]
