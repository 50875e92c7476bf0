"""``KvtierMlxConnector``: kvtier's connector (vLLM's ``OffloadingConnector``) taking an MLX
paged cache.

Loaded through vLLM's ``kv_connector_module_path``. Everything is upstream's but the worker
side's registration: an MLX engine hands ``register_kv_caches`` its cache object (vllm-metal's
``MetalPagedKVCache`` or another in one of ``kvtier.mlx.layouts``'s layouts) instead of a dict
of torch tensors, and the spec builds the MLX worker over it. Store, load and finished jobs
then flow through upstream's connector worker as on every other platform.
"""

from kvtier.errors import ConfigError
from kvtier.vllm.connector import KvtierConnector
from kvtier.vllm.mlx_spec import KvtierMlxSpec


class KvtierMlxConnector(KvtierConnector):
    """``KvtierConnector`` (tenant tags on the scheduler side) whose worker side registers an
    MLX cache."""

    def register_kv_caches(self, kv_caches: object) -> None:  # type: ignore[override]
        worker_side = self.connector_worker
        if worker_side is None:
            raise RuntimeError("register_kv_caches runs on the worker side only")
        spec = worker_side.spec
        if not isinstance(spec, KvtierMlxSpec):
            raise ConfigError(
                f"kvtier: KvtierMlxConnector needs spec_name='KvtierMlxSpec' "
                f"(spec_module_path='kvtier.vllm.mlx_spec'), got {type(spec).__name__}; build the "
                "config with kvtier.mlx.mlx_transfer_config()"
            )
        worker_side.worker = spec.get_mlx_worker(kv_caches)
