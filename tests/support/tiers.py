"""vLLM offloading configs for tier tests without an engine."""

from pathlib import Path
from types import SimpleNamespace

from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

from kvtier.vllm.engine_context import EngineContext, KvtierSpec


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


def stock_spec(config: OffloadingConfig, replicated_layout: bool = False) -> SimpleNamespace:
    """What a stock spec (vLLM's own, no kvtier spec) shows a tier: its geometry only, so the
    tier decides in a context of its own (``EngineContext.stock``)."""
    return SimpleNamespace(config=config, replicated_layout=replicated_layout)


class KvtierSpecStub(KvtierSpec):
    """kvtier's spec as its tiers see it: the geometry and the engine's context, without
    building vLLM's spec."""

    def __init__(self, config: OffloadingConfig, context: EngineContext) -> None:
        self.config = config
        self.kvtier = context
        self.replicated_layout = False
