"""kvtier's data plane for MLX paged KV caches (Apple silicon; verified on MLX's CPU backend).

What moves MLX blocks, without vLLM: the cache layouts and their arrays (``layouts``), MLX's
gather and scatter of whole blocks (``block_copy``), where a transfer's blocks go in the host
pool's rows (``transfer_plan``), the pool and staging fitted into RAM (``memory_budget``), the
options (``settings``) and the ``kv_transfer_config`` that names them (``transfer_config``).
vLLM's side is in ``kvtier.vllm``: an MLX engine hands its cache to
``KvtierMlxConnector.register_kv_caches`` (``kvtier.vllm.mlx_connector``), ``KvtierMlxSpec``
(``kvtier.vllm.mlx_spec``) builds ``MlxOffloadingWorker`` (``kvtier.vllm.mlx_worker``) over it, and
the disk and shared tiers take the host-pool rows from there as on the CPU backend. The
scheduler side is vLLM's, unchanged, with kvtier's spec and tiers.

Optional: the ``[mlx]`` extra. Importing this package without MLX raises ``MissingExtraError``
naming what to install; nothing else in kvtier imports it but the three ``kvtier.vllm.mlx_*``
modules. Nothing here imports vllm-metal.
"""

from kvtier.errors import ConfigError
from kvtier.extras import require

require("mlx", "kvtier's MLX data plane (kvtier.mlx)")

try:
    import mlx.core  # noqa: F401  (the backend library loads here, or not at all)
except ImportError as exc:
    # Plain `mlx` on Linux ships no backend (libmlx.so): the CPU one is the mlx-cpu wheel.
    raise ConfigError(
        f"kvtier: MLX is installed but its backend does not load ({exc}); on Linux install "
        'MLX\'s CPU backend: pip install "mlx[cpu]>=0.32,<0.33"'
    ) from exc

from kvtier.mlx.transfer_config import mlx_transfer_config  # noqa: E402  (after the checks)

__all__ = ["mlx_transfer_config"]
