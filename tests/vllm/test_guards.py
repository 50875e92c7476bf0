"""Each start-up guard refuses what it must, with the values and the fix, and accepts the rest."""

import pytest

from kvtier.errors import ConfigError
from kvtier.runtime.guards import (
    check_cpu_data_plane_options,
    check_group_kinds,
    check_hash_stability,
    check_kv_dtypes,
    check_tiering_options,
    persistent_tiers,
    spec_kind,
)
from tests.support.releases import API032

DISK = [{"type": "KvtierDiskTier", "module_path": "kvtier.vllm.disk_tier"}]
#: vLLM's CPU build: NONE_HASH fixed without a seed for these (``Release.stable_hash_algos``).
STABLE = API032.stable_hash_algos


# -- upstream connector options --------------------------------------------------------------
def test_canonical_layout_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"canonical_layout=True is not supported .* remove"):
        check_cpu_data_plane_options({"canonical_layout": True})


def test_store_threshold_of_two_or_more_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"store_threshold=2 is not supported.*remove"):
        check_tiering_options({"store_threshold": 2})


def test_supported_connector_options_pass():
    extra = {"store_threshold": 1, "canonical_layout": False, "block_size": 256}
    check_tiering_options(extra)
    check_cpu_data_plane_options(extra)


# -- block-hash stability --------------------------------------------------------------------
def test_random_hash_seed_with_a_disk_tier_is_refused_naming_both_fixes():
    with pytest.raises(ConfigError) as err:
        check_hash_stability("xxhash", None, persistent_tiers(DISK), STABLE)
    message = str(err.value)
    assert "prefix_caching_hash_algo='xxhash' seeds block hashes randomly" in message
    assert "['KvtierDiskTier']" in message
    assert "PYTHONHASHSEED" in message and "sha256_cbor" in message


def test_xxhash_with_pythonhashseed_set_is_accepted():
    check_hash_stability("xxhash_cbor", "0", persistent_tiers(DISK), STABLE)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_sha256_hashes_are_stable_without_a_seed(algo):
    check_hash_stability(algo, None, persistent_tiers(DISK), STABLE)


def test_random_hash_seed_without_a_persistent_tier_is_accepted():
    check_hash_stability("xxhash", None, persistent_tiers([{"type": "example"}]), STABLE)


def test_every_tier_but_the_in_memory_example_counts_as_persistent():
    assert persistent_tiers([{"type": "fs"}, {"type": "example"}, *DISK]) == [
        "fs",
        "KvtierDiskTier",
    ]


# -- KV dtypes -----------------------------------------------------------------------------
def test_offloaded_layers_with_different_kv_dtypes_are_refused():
    dtypes = {"l.0": "float8_e4m3fn", "l.1": "bfloat16", "l.2": "float8_e4m3fn"}
    with pytest.raises(ConfigError) as err:
        check_kv_dtypes(dtypes)
    message = str(err.value)
    assert "float8_e4m3fn: 2 layer(s), e.g. l.0; bfloat16: 1 layer(s), e.g. l.1" in message
    assert "--kv-cache-dtype-skip-layers" in message


def test_one_kv_dtype_for_every_layer_is_accepted():
    check_kv_dtypes({"l.0": "bfloat16", "l.1": "bfloat16"})


# -- KV group kinds ------------------------------------------------------------------------
def test_recurrent_state_groups_are_refused_with_why():
    with pytest.raises(
        ConfigError,
        match=r"group\(s\) \{1: \['mamba'\]\} hold state .* not "
        r"per-token KV and would restore wrong",
    ):
        check_group_kinds({0: ["full"], 1: ["mamba"]})


def test_full_and_sliding_window_groups_are_accepted():
    check_group_kinds({0: ["full", "full"], 1: ["sliding", "sliding"]})


def test_spec_kinds_follow_vllm_class_names():
    full = type("FullAttentionSpec", (), {})
    attention = type("AttentionSpec", (), {})
    assert spec_kind(full()) == "full"
    assert spec_kind(type("SlidingWindowSpec", (attention,), {})()) == "sliding"
    assert spec_kind(type("MLAAttentionSpec", (full,), {})()) == "mla"
    assert spec_kind(type("MambaSpec", (), {})()) == "mamba"
    assert spec_kind(type("SinkFullAttentionSpec", (full,), {})()) == "SinkFullAttentionSpec"
