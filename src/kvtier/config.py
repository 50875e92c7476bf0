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


def kv_transfer_config(
    host_pool: int | str = DEFAULT_HOST_POOL,
    disk_dir: str | os.PathLike[str] | None = None,
    disk_threads: int = 4,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build vLLM's ``kv_transfer_config`` dict for kvtier.

    host_pool: size of the host-RAM pool (bytes or a string such as ``"4GiB"``), total over all
        tensor-parallel ranks. Blocks evicted from the engine's KV cache are restored from here.
    disk_dir: folder of the persistent disk tier; ``None`` keeps only the host pool. Blocks
        written here survive engine restarts and are served to a fresh process.
    disk_threads: I/O threads of the disk tier for reads and for writes, each.
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
    if disk_dir is not None:
        root = Path(disk_dir).expanduser().absolute()
        connector_extra["secondary_tiers"].append(
            {
                "type": "fs",
                "root_dir": str(root),
                "n_read_threads": disk_threads,
                "n_write_threads": disk_threads,
            }
        )
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        # A failed restore is recomputed, never turned into a failed request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": connector_extra,
    }
