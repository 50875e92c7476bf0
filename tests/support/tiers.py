"""vLLM offloading configs for tier tests without an engine."""

from pathlib import Path

from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)


def offloading_config(model_dir: Path, row_bytes: int) -> OffloadingConfig:
    """One group of one layer, 128-token blocks of ``row_bytes``, one rank."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(128, ("layer.0",), 0),),
        worker_kv_bytes_per_block=row_bytes,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="test",
        model=OffloadingModelConfig(name=str(model_dir), dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=128, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True),
    )
