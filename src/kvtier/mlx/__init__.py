"""kvtier's data plane for MLX paged KV caches (Apple silicon; verified on MLX's CPU backend).

An engine that keeps its paged KV cache in MLX arrays (vllm-metal's layouts) hands the cache to
``KvtierMlxConnector.register_kv_caches``; ``MlxOffloadingWorker`` then moves blocks between
those arrays and kvtier's host-pool rows with MLX's own gather (``take``) and scatter (index
assignment), and the disk and shared tiers take the rows from there exactly as on the CPU
backend. The scheduler side is vLLM's, unchanged, with kvtier's spec and tiers.

Optional: the ``[mlx]`` extra. Importing this package without MLX raises ``MissingExtraError``
naming what to install; nothing else in kvtier imports it. Nothing here imports vllm-metal.
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
