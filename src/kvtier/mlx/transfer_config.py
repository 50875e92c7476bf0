"""``mlx_transfer_config()``: vLLM's ``kv_transfer_config`` for an engine with an MLX cache."""

from typing import Any

from kvtier.mlx.settings import MLX_OPTIONS_KEY, MlxSettings
from kvtier.transfer_config import kv_transfer_config


def mlx_transfer_config(
    kv_layout: str = "pages", staging: int | str = 64 * 2**20, **options: Any
) -> dict[str, Any]:
    """``kvtier.kv_transfer_config(**options)`` with the MLX connector, spec and settings.

    kv_layout: the engine's MLX cache layout, 'pages' or 'layerwise' (``kvtier.mlx.layouts``).
    staging: bytes of one array a copy moves at a time (e.g. ``"64MiB"``).
    options: every option of ``kvtier.kv_transfer_config`` (host pool, disk and shared tiers);
        ``platform`` is the MLX one here and cannot be given.
    """
    settings = MlxSettings.parse({"kv_layout": kv_layout, "staging_bytes": staging})
    config = kv_transfer_config(**options)
    config["kv_connector"] = "KvtierMlxConnector"
    config["kv_connector_module_path"] = "kvtier.vllm.mlx_connector"
    extra = config["kv_connector_extra_config"]
    extra["spec_name"] = "KvtierMlxSpec"
    extra["spec_module_path"] = "kvtier.vllm.mlx_spec"
    extra[MLX_OPTIONS_KEY] = settings.to_dict()
    return config
