"""API 0.26 (vLLM 0.26.0, CUDA, torch 2.11): API 0.25's tiers under a spec built from an
``OffloadingConfig``.

What a tier meets is API 0.25's (``JobMetadata`` with ``block_ids``, a ``JobResult`` of
``job_id`` and ``success``, the tier base without a back-pressure detector, a request context
without state or key positions, tiers found by registered name, ``NONE_HASH`` random without
``PYTHONHASHSEED``). The spec side is newer: vLLM builds the spec from one ``OffloadingConfig``
(the engine's geometry, read as it is, but for the layout and group ids it lacks before 0.29
and 0.30), the tiering spec keeps an ``_engine_id``, the host-pool region takes ``engine_id``,
``num_blocks`` and ``kv_bytes_per_block``, and the spec no longer keeps ``vllm_config``: vLLM's
config is seen only where it is current (``get_current_vllm_config_or_none``).
"""

from __future__ import annotations

from typing import Any

from kvtier.vllm.release.api_0_25 import Api025
from kvtier.vllm.release.protocol import (
    CacheView,
    GroupView,
    ModelView,
    OffloadingView,
    ParallelView,
)


class Api026(Api025):
    api = "0.26"

    def offloading_view(self, spec: Any) -> OffloadingView:
        """The spec's ``OffloadingConfig`` with the group ids (their order) and the layout
        (unknown: None) that API 0.32's has."""
        config = spec.config
        parallel = config.parallel
        return OffloadingView(
            groups=tuple(
                GroupView(int(group.tokens_per_block), tuple(group.layer_names), index)
                for index, group in enumerate(config.groups)
            ),
            worker_kv_bytes_per_block=int(config.worker_kv_bytes_per_block),
            model=ModelView(str(config.model.name), str(config.model.dtype)),
            cache=CacheView(int(config.cache.tokens_per_hash), int(config.cache.blocks_per_chunk)),
            parallel=ParallelView(
                rank=int(parallel.rank),
                world_size=int(parallel.world_size),
                tp_size=int(parallel.tp_size),
                pp_size=int(parallel.pp_size),
                pcp_size=int(parallel.pcp_size),
                dcp_size=int(parallel.dcp_size),
            ),
            kv_cache_layout=None,
        )

    def region_kwargs(
        self, engine_id: str, rows: int, rank: int | None, row_bytes: int, page_size: int
    ) -> dict[str, Any]:
        return {
            "engine_id": engine_id,
            "num_blocks": rows,
            "rank": rank,
            "kv_bytes_per_block": row_bytes,
            "cpu_page_size": page_size,
        }

    def engine_id(self, spec: Any) -> str:
        return str(spec._engine_id)

    def engine_vllm_config(self, spec: Any) -> Any:
        """vLLM's ``VllmConfig`` where it is current (building the worker's spec), else None."""
        from vllm.config import get_current_vllm_config_or_none

        return get_current_vllm_config_or_none()
