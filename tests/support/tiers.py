"""vLLM offloading configs for tier tests without an engine."""

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import TransferJob

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


def finish_job(tier, job_id: int, keys, rows, load: bool, ctx: ReqContext):  # type: ignore[no-untyped-def]
    """Submit a store (``load`` false) or load job of ``ctx``'s request to ``tier`` and return
    its result once the tier reports it (at most 30 s)."""
    job = TransferJob(job_id, keys, np.array(rows, dtype=np.int32), load, ctx)
    (tier.submit_load if load else tier.submit_store)(job)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        results = list(tier.get_finished_jobs())
        if results:
            (result,) = results
            return result
        time.sleep(0.01)
    raise AssertionError("job did not finish")
