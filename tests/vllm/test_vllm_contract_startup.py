"""Fail loudly when vLLM interfaces the start-up guards and the disk-backed pool use change.

Each assertion names one thing ``kvtier.vllm.spec``, ``guards`` or ``file_region`` relies on.
"""

import inspect

from vllm.config import get_current_vllm_config_or_none
from vllm.model_executor.layers.attention.attention import Attention
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.worker.gpu_worker import Worker


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_worker_connector_is_built_inside_the_vllm_config_context_after_the_block_count():
    # Worker.initialize_from_config sets num_gpu_blocks, then creates the KV connector; the
    # worker wrapper runs it inside set_current_vllm_config (what the guards read).
    source = inspect.getsource(Worker.initialize_from_config)
    assert source.index("num_gpu_blocks = kv_cache_config.num_blocks") < source.index(
        "ensure_kv_transfer_initialized"
    )
    assert get_current_vllm_config_or_none() is None  # outside an engine: guards skipped


def test_pieces_reassembled_by_the_file_backed_get_manager():
    assert params(CPUPrimaryTierOffloadingManager.__init__) == [
        "self",
        "num_chunks",
        "mmap_region",
        "cache_policy",
        "cache_policy_module_path",
        "enable_events",
    ]
    assert params(TieringOffloadingManager.__init__) == ["self", "primary_tier", "secondary_tiers"]
    assert params(SecondaryTierFactory.create_secondary_tier)[-3:] == [
        "tier_config",
        "primary_kv_view",
        "offloading_spec",
    ]
    get_manager = inspect.getsource(TieringOffloadingSpec.get_manager)
    for piece in (
        "SharedOffloadRegion(",
        "CPUPrimaryTierOffloadingManager(",
        "create_secondary_tier(",
        "TieringOffloadingManager(",
        "self._scheduler_mmap = scheduler_mmap",
    ):
        assert piece in get_manager, piece


def test_region_attributes_the_file_backed_region_sets_itself():
    source = inspect.getsource(SharedOffloadRegion)
    for attribute in (
        "self.page_size",
        "self.num_chunks",
        "self._row_stride",
        "self.total_size_bytes",
        "self.mmap_path",
        "self._creator",
        "self._worker_offset",
        "self._worker_area_end",
        "self.fd",
        "self.mmap_obj",
        "self._base",
        "self._views",
        "self._canonical_offset",
        "self.is_pinned",
        "self.pinned_addresses",
    ):
        assert attribute in source, attribute
    assert "/dev/shm/vllm_offload_" in source  # why kvtier needs its own region class


def test_xxhash_seeds_randomly_without_pythonhashseed(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    from vllm.utils.hashing import get_hash_fn_by_name

    xxhash = get_hash_fn_by_name("xxhash")
    assert kv_cache_utils.resolve_none_hash_seed(xxhash) != kv_cache_utils.resolve_none_hash_seed(
        xxhash
    )
    sha = get_hash_fn_by_name("sha256")
    assert kv_cache_utils.resolve_none_hash_seed(sha) == kv_cache_utils.DEFAULT_NONE_HASH_SEED
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert kv_cache_utils.resolve_none_hash_seed(xxhash) == "7"


def test_attention_layers_expose_kv_dtype_and_kv_spec():
    assert "self.kv_cache_torch_dtype" in inspect.getsource(Attention.__init__)
    assert params(Attention.get_kv_cache_spec) == ["self", "vllm_config"]


def test_cpu_backend_runs_the_hybrid_kv_cache_manager():
    # Sliding-window groups reach the connector as separate KV groups (docs/architecture.md).
    assert CpuPlatform.support_hybrid_kv_cache() is True
