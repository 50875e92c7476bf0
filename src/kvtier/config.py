"""``kv_transfer_config``: the one call that turns kvtier on for a vLLM engine.

It returns the plain dict vLLM takes as ``kv_transfer_config`` (``LLM(kv_transfer_config=...)``
or ``--kv-transfer-config '<json>'``). Every option has a default that works; the dict names
vLLM's stock ``OffloadingConnector`` and plugs kvtier in through ``spec_module_path`` and tier
``module_path`` only.
"""

import os
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.units import parse_size

SPEC_NAME = "KvtierCpuSpec"
SPEC_MODULE = "kvtier.vllm.spec"

DEFAULT_HOST_POOL = "2GiB"
DISK_TIER_TYPE = "KvtierDiskTier"
DISK_TIER_MODULE = "kvtier.vllm.disk_tier"
# Without a given capacity the disk tier takes a quarter of its file system, at most 256 GiB:
# large enough to outlast the engine's own pool many times, small enough to share the disk.
AUTO_CAPACITY_FRACTION = 0.25
AUTO_CAPACITY_MAX = 256 * 2**30
# Upstream connector keys a user may still pass through ``extra``; anything else is a typo.
PASSTHROUGH_KEYS = frozenset(
    {
        "eviction_policy",
        "cache_policy_module_path",
        "block_size",
        "blocks_per_chunk",
        "offload_prompt_only",
        "tier_poll_interval_s",
    }
)


def auto_disk_capacity(disk_dir: Path) -> int:
    """Default disk-tier cap: a quarter of the file system holding ``disk_dir``, <= 256 GiB."""
    probe = disk_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return min(int(st.f_blocks * st.f_frsize * AUTO_CAPACITY_FRACTION), AUTO_CAPACITY_MAX)


def kv_transfer_config(
    host_pool: int | str = DEFAULT_HOST_POOL,
    disk_dir: str | os.PathLike[str] | None = None,
    disk_capacity: int | str | None = None,
    disk_threads: int = 4,
    disk_tier: str = "kvtier",
    fsync: str = "never",
    host_pool_dir: str | os.PathLike[str] | None = None,
    allow_small_tiers: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build vLLM's ``kv_transfer_config`` dict for kvtier.

    host_pool: size of the host-RAM pool (bytes or a string such as ``"4GiB"``), total over all
        tensor-parallel ranks. Blocks evicted from the engine's KV cache are restored from here.
    disk_dir: folder of the persistent disk tier; ``None`` keeps only the host pool. Blocks
        written here survive engine restarts and are served to a fresh process.
    disk_capacity: byte cap of the disk tier (e.g. ``"64GiB"``); default: a quarter of the file
        system holding ``disk_dir``, at most 256 GiB. Least recently used blocks are evicted.
    disk_threads: I/O threads of the disk tier for reads and for writes, each.
    disk_tier: ``"kvtier"`` (checksummed, bounded, crash-safe; the default) or ``"fs"`` (vLLM's
        stock tier: unbounded, unverified; kept for comparisons).
    fsync: when kvtier's disk tier syncs a record to stable storage: ``"never"`` (the default;
        a crash can lose recent records but never serve a torn one, since every load is
        checksummed), ``"data"`` or ``"always"`` (data and folder).
    host_pool_dir: back the host pool with a sparse file in this folder on local disk instead
        of ``/dev/shm`` (RAM): for a pool larger than the RAM you can spare. Only rows in use
        cost disk space and page cache; the file is removed however the engine stops.
    allow_small_tiers: start even when a tier cannot hold more than the engine's own KV pool
        (such a tier never serves a restore); kvtier then warns instead of refusing.
    extra: upstream ``OffloadingConnector`` options passed through unchanged
        (one of ``PASSTHROUGH_KEYS``).
    """
    host_pool_bytes = parse_size(host_pool, "host_pool")
    if host_pool_bytes <= 0:
        raise ConfigError("host_pool=0; give the host pool a size such as '2GiB'")
    if not isinstance(disk_threads, int) or disk_threads < 1:
        raise ConfigError(f"disk_threads={disk_threads!r}; give a positive integer such as 4")
    extra = dict(extra or {})
    unknown = sorted(set(extra) - PASSTHROUGH_KEYS)
    if unknown:
        raise ConfigError(f"unknown extra option(s) {unknown}; known: {sorted(PASSTHROUGH_KEYS)}")

    connector_extra: dict[str, Any] = {
        "spec_name": SPEC_NAME,
        "spec_module_path": SPEC_MODULE,
        "cpu_bytes_to_use": host_pool_bytes,
        "secondary_tiers": [],
        **extra,
    }
    if host_pool_dir is not None:
        connector_extra["kvtier_host_pool_dir"] = str(Path(host_pool_dir).expanduser().absolute())
    if not isinstance(allow_small_tiers, bool):
        raise ConfigError(f"allow_small_tiers={allow_small_tiers!r}; give True or False")
    if allow_small_tiers:
        connector_extra["kvtier_allow_small_tiers"] = True
    if disk_tier not in ("kvtier", "fs"):
        raise ConfigError(f"disk_tier={disk_tier!r}; use 'kvtier' (default) or 'fs'")
    if fsync not in ("never", "data", "always"):
        raise ConfigError(f"fsync={fsync!r}; use 'never' (default), 'data' or 'always'")
    if disk_dir is not None:
        root = Path(disk_dir).expanduser().absolute()
        if disk_tier == "fs":
            tier: dict[str, Any] = {
                "type": "fs",
                "root_dir": str(root),
                "n_read_threads": disk_threads,
                "n_write_threads": disk_threads,
            }
        else:
            capacity = (
                auto_disk_capacity(root)
                if disk_capacity is None
                else parse_size(disk_capacity, "disk_capacity")
            )
            if capacity <= 0:
                raise ConfigError("disk_capacity=0; give the disk tier a size such as '64GiB'")
            tier = {
                "type": DISK_TIER_TYPE,
                "module_path": DISK_TIER_MODULE,
                "root_dir": str(root),
                "capacity_bytes": capacity,
                "io_threads": disk_threads,
                "fsync": fsync,
            }
        connector_extra["secondary_tiers"].append(tier)
    elif disk_capacity is not None:
        raise ConfigError("disk_capacity is set but disk_dir is not; give disk_dir too")
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        # A failed restore is recomputed, never turned into a failed request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": connector_extra,
    }
