"""Start-up guards: refuse configurations that would serve wrong KV or silently do nothing.

Each guard is a function over plain values that raises ``ConfigError`` with what is wrong, the
offending values and the fix, so it can be unit-tested without an engine. ``KvtierCpuSpec``
collects the values from vLLM and calls them (both specs parse and check their options
through ``kvtier.vllm.engine_context.start_options``):

=================================  =========================  ==============================
guard                              runs in                    reads
=================================  =========================  ==============================
``kvtier.settings``                every spec (both roles)    kvtier's options and tiers
``check_tiering_options``          every spec                 ``kv_connector_extra_config``
``check_cpu_data_plane_options``   the CPU spec               ``kv_connector_extra_config``
``check_hash_stability``           worker spec ``__init__``   vLLM config (hash), env
``check_kv_dtypes``                worker spec ``__init__``   attention layers' KV dtypes
``check_group_kinds``              worker spec ``__init__``   layers' KV cache specs
``kvtier.hostpool.sizing``         worker ``get_worker``      engine KV tensors, pool rows
``kvtier.hostpool.ram_guard``      worker ``get_worker``      meminfo, cgroup, /dev/shm
=================================  =========================  ==============================

Why the worker: vLLM builds the worker's connector inside ``set_current_vllm_config`` with the
engine's block count already set (``cache_config.num_gpu_blocks``), while the scheduler's spec
sees only the ``OffloadingConfig``; and the worker is built first, so a refusal stops the engine
before any pool exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.errors import ConfigError

#: Secondary tiers that keep blocks only in this process's memory; any other tier persists
#: blocks (or shares them with other processes), so block hashes must be stable.
VOLATILE_TIER_TYPES = frozenset({"example"})


def check_cpu_data_plane_options(extra: Mapping[str, Any]) -> None:
    """Refuse upstream connector options kvtier's CPU data plane cannot honour."""
    if extra.get("canonical_layout"):
        raise ConfigError(
            f"kvtier: canonical_layout={extra['canonical_layout']!r} is not supported by the "
            "CPU data plane (it copies each rank's own pages); remove canonical_layout from "
            "kv_connector_extra_config"
        )


def check_tiering_options(extra: Mapping[str, Any]) -> None:
    """Refuse upstream connector options vLLM's tiering spec cannot honour (every platform)."""
    threshold = extra.get("store_threshold", 0)
    try:
        threshold_value = int(threshold)
    except (TypeError, ValueError):
        threshold_value = 2
    if threshold_value >= 2:
        raise ConfigError(
            f"kvtier: store_threshold={threshold!r} is not supported: vLLM's tiering spec "
            "admits every store (it raises on this option only once the scheduler starts); "
            "remove store_threshold from kv_connector_extra_config"
        )


def persistent_tiers(secondary_tiers: Sequence[Mapping[str, Any]]) -> list[str]:
    """Types of the configured tiers that outlive the process or are shared with others."""
    return [
        str(t.get("type"))
        for t in secondary_tiers
        if isinstance(t, Mapping) and t.get("type") not in VOLATILE_TIER_TYPES
    ]


def check_hash_stability(
    hash_algo: str,
    pythonhashseed: str | None,
    tier_types: Sequence[str],
    stable_algos: frozenset[str],
) -> None:
    """Refuse a persistent tier under block hashes that change with every process.

    vLLM seeds its block-hash chain (``NONE_HASH``) from ``PYTHONHASHSEED`` when set; otherwise from
    a fixed seed for the algorithms in ``stable_algos`` (``Release.stable_hash_algos``:
    sha256/sha256_cbor on API 0.32, none on API 0.25) and from ``os.urandom`` for the others. With a
    random seed every restart, and every engine process, computes other keys: the disk tier would
    fill with blocks no later process can find, silently.
    """
    if not tier_types or hash_algo in stable_algos or pythonhashseed is not None:
        return
    if not stable_algos:
        raise ConfigError(
            f"kvtier: PYTHONHASHSEED is not set, and this vLLM then seeds block hashes "
            f"randomly in every process (any prefix_caching_hash_algo), so the persistent "
            f"tier(s) {tier_types} could never serve a block after a restart. Set "
            "PYTHONHASHSEED to the same value for every engine before starting it "
            "(e.g. PYTHONHASHSEED=0)"
        )
    raise ConfigError(
        f"kvtier: prefix_caching_hash_algo={hash_algo!r} seeds block hashes randomly in every "
        f"process (PYTHONHASHSEED is not set), so the persistent tier(s) {tier_types} could "
        "never serve a block after a restart. Set PYTHONHASHSEED to the same value for every "
        "engine (e.g. PYTHONHASHSEED=0), or use --prefix-caching-hash-algo sha256_cbor "
        "(or sha256)"
    )


def check_kv_dtypes(layer_dtypes: Mapping[str, str]) -> None:
    """Refuse offloaded layers with different KV dtypes (e.g. fp8 plus skipped layers).

    The tiers and their namespace record one KV dtype per engine; mixed pages would be stored
    under a namespace that describes only one of them.
    """
    by_dtype: dict[str, list[str]] = {}
    for layer, dtype in layer_dtypes.items():
        by_dtype.setdefault(dtype, []).append(layer)
    if len(by_dtype) <= 1:
        return
    summary = "; ".join(
        f"{dtype}: {len(layers)} layer(s), e.g. {layers[0]}" for dtype, layers in by_dtype.items()
    )
    raise ConfigError(
        f"kvtier: the offloaded layers use different KV dtypes ({summary}); kvtier stores one "
        "KV dtype per engine. Use one --kv-cache-dtype for every layer (remove "
        "--kv-cache-dtype-skip-layers)"
    )


#: KV cache kinds the CPU data plane restores correctly (checked by the model matrix).
SUPPORTED_KINDS = frozenset({"full", "sliding", "chunked_local", "mla"})


def check_group_kinds(group_kinds: Mapping[int, Sequence[str]]) -> None:
    """Refuse KV groups whose state is not plain attention KV pages.

    ``group_kinds`` maps each offloaded group to the kinds of its layers. Sliding-window and
    chunked-local groups are offloaded by vLLM's connector with window-aware lookups (only
    chunks a restore can use are stored); recurrent state (Mamba, linear attention) is a
    per-request running state, not per-token pages, and kvtier does not offload it.
    """
    bad = {
        group: sorted(set(kinds) - SUPPORTED_KINDS)
        for group, kinds in group_kinds.items()
        if set(kinds) - SUPPORTED_KINDS
    }
    if bad:
        raise ConfigError(
            f"kvtier: KV cache group(s) {bad} hold state kvtier cannot offload (supported: "
            f"{sorted(SUPPORTED_KINDS)}); recurrent or other non-attention state is not "
            "per-token KV and would restore wrong. Serve this model without kvtier"
        )


def spec_kind(spec: Any) -> str:
    """Kind name of a vLLM ``KVCacheSpec`` (by class name, so no vLLM import is needed)."""
    names = [cls.__name__ for cls in type(spec).__mro__]
    if "MambaSpec" in names:
        return "mamba"
    if "SlidingWindowSpec" in names:
        return "sliding"
    if "ChunkedLocalAttentionSpec" in names:
        return "chunked_local"
    if "MLAAttentionSpec" in names:
        return "mla"
    if type(spec).__name__ == "FullAttentionSpec":
        return "full"
    return type(spec).__name__
