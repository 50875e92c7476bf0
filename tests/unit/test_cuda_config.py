"""kv_transfer_config(platform="cuda"): vLLM's own TieringOffloadingSpec builds kvtier's tiers.

vLLM's CUDA build runs the host pool with its own spec, whose worker needs a GPU; its scheduler
side does not, so the manager it builds from kvtier's config (and kvtier's tier inside it) is
checked here on the CPU. The GPU worker itself is untested here (no GPU for vLLM).
"""

import uuid

from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

import kvtier
from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.regions import region_path


def test_vllms_own_spec_builds_and_shuts_down_kvtiers_disk_tier(tmp_path):
    config = kvtier.kv_transfer_config(
        host_pool="64MiB", disk_dir=tmp_path, disk_capacity="64MiB", platform="cuda"
    )
    engine_id = f"kvtier-cuda-{uuid.uuid4().hex}"
    offloading = OffloadingConfig(
        groups=(OffloadingGroupConfig(128, ("l.0",), 0),),
        worker_kv_bytes_per_block=65536,
        enable_kv_cache_events=False,
        extra_config=config["kv_connector_extra_config"],
        engine_id=engine_id,
        model=OffloadingModelConfig(name="m", dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=128, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True),
    )
    init_none_hash(sha256)
    manager = TieringOffloadingSpec(offloading).get_manager()
    try:
        (tier,) = manager.secondary_tiers
        assert isinstance(tier, KvtierDiskTier)
        assert tier.decider.policy.settings.enabled, "the tier keeps its own policy, on"
    finally:
        manager.shutdown()  # must release the host pool (no exported-pointer error)
        region_path(engine_id).unlink(missing_ok=True)
