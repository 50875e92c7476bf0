"""Sizing math: bytes per token, rows, records, tokens, and the sizing trap's verdicts."""

import json

import pytest

from kvtier.errors import ConfigError
from kvtier.hostpool.sizing import (
    KvGroup,
    RowGeometry,
    check_tiers,
    enforce,
    engine_blocks,
    geometry_for,
    group_layers,
    layout_from_config,
    layout_from_model_dir,
    suggest_size,
)

SMOLLM2 = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_size": 576,
    "dtype": "float32",
    "max_position_embeddings": 8192,
}
GiB = 2**30
MiB = 2**20


def test_smollm2_offloads_45_kib_per_token_in_one_group():
    layout = layout_from_config(SMOLLM2)
    assert layout.groups == (KvGroup("full", 30),)
    # 30 layers x K,V x 3 heads x 64 dims x 4 bytes
    assert layout.offloaded_bytes_per_token() == 30 * 2 * 3 * 64 * 4 == 45 * 1024
    assert layout.block_bytes(128) == 45 * 1024 * 128


def test_kv_dtype_override_changes_bytes_per_element():
    assert layout_from_config(SMOLLM2, kv_dtype="bfloat16").offloaded_bytes_per_token() == (
        45 * 512
    )
    assert layout_from_config(SMOLLM2, kv_dtype="fp8").dtype_bytes == 1


def test_unknown_kv_dtype_names_the_known_ones():
    with pytest.raises(ConfigError, match="kv dtype 'int3' is unknown; use one of"):
        layout_from_config(SMOLLM2, kv_dtype="int3")


def test_engine_pool_is_carved_into_whole_blocks():
    block = layout_from_config(SMOLLM2).block_bytes(128)
    assert engine_blocks(1 * GiB, block) == 182  # 1 GiB / 5.625 MiB


def test_host_rows_divide_the_pool_by_the_page_aligned_row():
    geometry = RowGeometry(block_bytes=6000, block_tokens=16, blocks_per_chunk=2, world_size=1)
    assert geometry.row_bytes == 12288  # 12000 rounded up to 4 KiB pages
    pool = geometry.host_pool(10 * 12288 + 12287)
    assert (pool.units, pool.tokens) == (10, 10 * 32)


def test_rows_hold_every_tensor_parallel_rank():
    geometry = RowGeometry(block_bytes=64 * 1024, block_tokens=128, world_size=2)
    assert geometry.row_bytes == 128 * 1024


def test_disk_records_count_the_4096_byte_header():
    geometry = RowGeometry(block_bytes=64 * 1024, block_tokens=128)
    disk = geometry.disk_tier(100 * (4096 + 64 * 1024) - 1)
    assert disk.unit_bytes == 4096 + 64 * 1024
    assert disk.units == 99


def test_sliding_window_layers_are_grouped_like_vllm():
    gemma2 = ["sliding", "full"] * 2
    assert group_layers([(k, 256 if k == "sliding" else None) for k in gemma2]) == (
        KvGroup("full", 2),
        KvGroup("sliding", 2, 256),
    )
    # Gemma 3 style 5:1 over 18 layers: groups of 3 layers, 1 full + 5 sliding
    kinds = [("full", None) if i % 6 == 5 else ("sliding", 512) for i in range(18)]
    groups = group_layers(kinds)
    assert [g.kind for g in groups] == ["full"] + ["sliding"] * 5
    assert {g.layers for g in groups} == {3}


def test_only_full_attention_groups_count_as_offloaded_bytes_per_token():
    config = {
        **SMOLLM2,
        "num_hidden_layers": 4,
        "sliding_window": 256,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    }
    layout = layout_from_config(config)
    assert len(layout.groups) == 4
    assert layout.num_full_groups == 1
    assert layout.offloaded_bytes_per_token() == 1 * 2 * 3 * 64 * 4


def test_every_layer_sliding_is_one_group_counted_in_full():
    layout = layout_from_config({**SMOLLM2, "sliding_window": 4096})
    assert layout.groups == (KvGroup("sliding", 30, 4096),)
    assert layout.num_full_groups == 1


def test_recurrent_layers_are_refused_with_the_reason():
    config = {**SMOLLM2, "num_hidden_layers": 2, "layer_types": ["mamba", "full_attention"]}
    with pytest.raises(ConfigError, match="recurrent state, not attention KV"):
        layout_from_config(config)


def test_model_folder_without_config_json_says_so(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json not found; give a local model folder"):
        layout_from_model_dir(tmp_path)


def test_model_folder_layout_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": SMOLLM2}))
    assert layout_from_model_dir(tmp_path).offloaded_bytes_per_token() == 45 * 1024


def smollm2_tiers(engine_kv: int, host_pool: int, disk: int | None = None):
    geometry = geometry_for(layout_from_config(SMOLLM2))
    engine = geometry.engine_pool(engine_blocks(engine_kv, geometry.block_bytes), engine_kv)
    tiers = [geometry.host_pool(host_pool)]
    if disk is not None:
        tiers.append(geometry.disk_tier(disk))
    return geometry, engine, tiers


def test_tiers_larger_than_the_engine_pool_pass():
    geometry, engine, tiers = smollm2_tiers(1 * GiB, 2 * GiB, 64 * GiB)
    verdict = check_tiers(engine, tiers, geometry)
    assert verdict.traps == () and verdict.notes == ()
    assert [t.tokens for t in (engine, *tiers)] == [23_296, 46_592, 1_490_176]


def test_host_pool_no_larger_than_the_engine_pool_is_a_trap_with_numbers_and_a_fix():
    geometry, engine, tiers = smollm2_tiers(4 * GiB, 2 * GiB)
    (trap,) = check_tiers(engine, tiers, geometry).traps
    assert trap.startswith("host pool: host_pool=2.00 GiB holds 46,592 tokens (364 x 5.62 MiB)")
    assert "no more than the engine KV pool (93,184 tokens, 4.00 GiB)" in trap
    assert "would never serve a restore" in trap
    # 729 rows are the fewest that clear 728 engine blocks
    assert "Give host_pool more than 4.00 GiB, e.g. 8.25GiB" in trap


def test_equal_sizes_are_a_trap_too():
    geometry, engine, tiers = smollm2_tiers(2 * GiB, 2 * GiB)
    assert len(check_tiers(engine, tiers, geometry).traps) == 1


def test_disk_tier_no_larger_than_the_engine_pool_is_a_trap():
    geometry, engine, tiers = smollm2_tiers(1 * GiB, 2 * GiB, 512 * MiB)
    (trap,) = check_tiers(engine, tiers, geometry).traps
    assert trap.startswith("disk tier: disk_capacity=512.00 MiB holds")


def test_disk_tier_no_larger_than_the_host_pool_is_only_a_note():
    geometry, engine, tiers = smollm2_tiers(1 * GiB, 4 * GiB, 2 * GiB)
    verdict = check_tiers(engine, tiers, geometry)
    assert verdict.traps == ()
    (note,) = verdict.notes
    assert "only serves restarts" in note


def test_enforce_refuses_a_trap_and_names_the_opt_out():
    geometry, engine, tiers = smollm2_tiers(4 * GiB, 2 * GiB)
    with pytest.raises(
        ConfigError, match=r"tier sizing trap: host pool: .* allow_small_tiers=True"
    ):
        enforce(check_tiers(engine, tiers, geometry), allow_small_tiers=False)


def test_enforce_with_allow_small_tiers_returns_the_warning_instead():
    geometry, engine, tiers = smollm2_tiers(4 * GiB, 2 * GiB)
    warnings = enforce(check_tiers(engine, tiers, geometry), allow_small_tiers=True)
    assert len(warnings) == 1 and warnings[0].startswith("host pool:")


@pytest.mark.parametrize(
    ("min_bytes", "text"),
    [(3 * MiB, "6MiB"), (int(1.1 * GiB), "2.25GiB"), (4 * GiB, "8GiB")],
)
def test_suggested_size_is_a_round_number_about_twice_the_minimum(min_bytes, text):
    assert suggest_size(min_bytes) == text
