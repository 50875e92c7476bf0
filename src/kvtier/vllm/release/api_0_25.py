"""API 0.25 (vLLM 0.25.1, CUDA): the older offloading interface, given API 0.32's shape.

A tier's job is ``JobMetadata`` with ``block_ids``; a job result carries only ``job_id`` and
``success`` (a partly failed load is a failed load: vLLM recomputes all of it); the tier base
takes no back-pressure detector and has no ``block_size_bytes``; the request context keeps no
state and no key positions; the tier factory loads tiers only from its registry; the engine's
geometry is read from the spec's ``vllm_config``; a worker's part of a host-pool row follows its
device index, not its TP rank; ``NONE_HASH`` is random for every algorithm without
``PYTHONHASHSEED``. kvtier's CPU spec does not run here: vLLM's own spec runs the host pool.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

from kvtier.vllm.release.protocol import (
    CacheView,
    GroupView,
    ModelView,
    OffloadingView,
    ParallelView,
    ReleaseBase,
)

#: The attribute holding kvtier's per-request state on a ``ReqContext`` (a plain dataclass,
#: created once per request and kept by vLLM's scheduler until it finishes).
STATE_ATTR = "_kvtier_state"


class Medium(enum.Enum):
    """API 0.25 has no tier medium; kept so tiers declare one on every release."""

    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(enum.Enum):
    """API 0.25 has no tier locality; kept so tiers declare one on every release."""

    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


def tier_base_for(base: type) -> type:
    """API 0.25's ``SecondaryTierManager`` with 0.32's constructor and ``block_size_bytes``."""

    class _TierBase(base):  # type: ignore[misc,valid-type]
        medium: Any = None

        def __init__(
            self,
            offloading_spec: Any,
            primary_kv_view: memoryview,
            tier_type: str,
            backpressure_detector: Any = None,
        ) -> None:
            super().__init__(offloading_spec, primary_kv_view, tier_type)
            self._block_size_bytes = int(primary_kv_view.strides[0])
            self.locality = None
            # No back-pressure detector here; stores are bounded by the tier's queue.
            self._bp_detector = backpressure_detector

        @property
        def block_size_bytes(self) -> int:
            return self._block_size_bytes

    _TierBase.__name__ = _TierBase.__qualname__ = "TierBase"
    return _TierBase


class Api025(ReleaseBase):
    api = "0.25"
    has_key_positions = False
    loads_tiers_by_path = False
    records_by_heads = False
    stable_hash_algos: frozenset[str] = frozenset()
    medium = Medium
    locality = Locality

    def __init__(
        self,
        name: str,
        *,
        tier_manager_base: type | None = None,
        job_result_cls: type | None = None,
    ) -> None:
        """``tier_manager_base`` and ``job_result_cls`` default to the installed vLLM's
        (``SecondaryTierManager``, ``JobResult``); tests pass stand-ins of API 0.25's."""
        super().__init__(name)
        self.tier_base = tier_base_for(tier_manager_base or SecondaryTierManager)
        if job_result_cls is None:
            from vllm.v1.kv_offload.tiering.base import JobResult as job_result_cls
        self._job_result_cls = job_result_cls

    def engine_id(self, spec: Any) -> str:
        return str(spec.vllm_config.instance_id)

    def replicated_layout(self, spec: Any) -> bool:
        return False  # API 0.25 gives each rank its own part of a row

    def job_rows(self, job: Any) -> Sequence[int]:
        return job.block_ids

    def job_result(
        self,
        job_id: int,
        success: bool,
        successful_keys: Any = None,
        transfer_time: float | None = None,
        transfer_bytes: int | None = None,
    ) -> Any:
        return self._job_result_cls(job_id=job_id, success=success)

    def get_request_state(self, ctx: Any, cls: type) -> Any:
        slots = getattr(ctx, STATE_ATTR, None)
        return None if slots is None else slots.get(cls)

    def set_request_state(self, ctx: Any, value: Any) -> None:
        slots = getattr(ctx, STATE_ATTR, None)
        if slots is None:
            slots = {}
            setattr(ctx, STATE_ATTR, slots)
        slots[type(value)] = value

    def key_position(self, ctx: Any, key: bytes) -> int | None:
        return None

    def key_positions(self, ctx: Any) -> dict[bytes, int] | None:
        return None

    def offloading_view(self, spec: Any) -> OffloadingView:
        """The spec's engine geometry in API 0.32's ``OffloadingConfig`` shape. Only values
        fixed by the engine's configuration go in (no instance id): the namespace is built
        from it and must be the same in every process and after a restart."""
        vllm_config = spec.vllm_config
        parallel = vllm_config.parallel_config
        cache_config = vllm_config.cache_config
        groups = tuple(
            GroupView(int(size), tuple(group.layer_names), index)
            for index, (size, group) in enumerate(
                zip(spec.gpu_block_size, spec.kv_cache_config.kv_cache_groups, strict=True)
            )
        )
        dtype = (
            vllm_config.model_config.dtype
            if cache_config.cache_dtype == "auto"
            else cache_config.cache_dtype
        )
        factor = max(int(spec.block_size_factor), 1)
        world = max(int(parallel.world_size), 1)
        return OffloadingView(
            groups=groups,
            worker_kv_bytes_per_block=int(spec.kv_bytes_per_offloaded_block) // factor // world,
            model=ModelView(str(vllm_config.model_config.model), str(dtype).removeprefix("torch.")),
            cache=CacheView(int(spec.hash_block_size), factor),
            parallel=ParallelView(
                rank=int(parallel.rank),
                world_size=world,
                tp_size=int(parallel.tensor_parallel_size),
                pp_size=int(parallel.pipeline_parallel_size),
                pcp_size=int(getattr(parallel, "prefill_context_parallel_size", 1)),
                dcp_size=int(getattr(parallel, "decode_context_parallel_size", 1)),
            ),
            kv_cache_layout=getattr(cache_config, "kv_cache_layout", None),
        )

    def region_kwargs(
        self, engine_id: str, rows: int, rank: int | None, row_bytes: int, page_size: int
    ) -> dict[str, Any]:
        return {
            "instance_id": engine_id,
            "num_blocks": rows,
            "rank": rank,
            "kv_bytes_per_block": row_bytes,
            "cpu_page_size": page_size,
        }

    def engine_vllm_config(self, spec: Any) -> Any:
        return spec.vllm_config

    def max_prompt_tokens(self, spec: Any) -> int | None:
        """The longest prompt the engine takes (``max_model_len``): without key positions
        the decision answers from it; None where vLLM's config does not say (the decision
        then waits a step for a hit it cannot refuse at once)."""
        return self.max_model_len(spec)

    def host_pool_rows(self, spec: Any) -> int:
        return int(spec.num_blocks)
