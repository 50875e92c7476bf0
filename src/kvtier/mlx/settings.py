"""``MlxSettings``: the MLX data plane's options, under ``kv_connector_extra_config["mlx"]``.

Both of vLLM's processes read them: the scheduler's disk tier puts the layout in its namespace
(``KvtierMlxSpec``), the worker copies in that layout within that staging bound. The host pool,
the disk and shared tiers keep their own settings (``kvtier.settings``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field

from kvtier.errors import ConfigError
from kvtier.settings import Bytes, SettingsModel, with_fix

#: The key of ``kv_connector_extra_config`` that holds these settings.
MLX_OPTIONS_KEY = "mlx"


class MlxSettings(SettingsModel):
    """The MLX data plane: which cache layout the engine allocates, and the copy's staging."""

    component: ClassVar[str] = "MLX data plane"

    #: The engine's MLX paged KV cache layout (``kvtier.mlx.layouts``): 'pages' (vLLM's
    #: canonical pages, newer vllm-metal) or 'layerwise' (per-layer key and value arrays,
    #: vllm-metal 0.3.0). Records of one layout are never read as the other.
    kv_layout: Literal["pages", "layerwise"] = Field(
        default="pages", **with_fix("give 'pages' or 'layerwise', the layout the engine allocates")
    )
    #: Bytes of one array a copy moves at a time; a transfer holds at most twice this besides
    #: the pool (the rows read and the MLX array made of them), counted in the memory budget.
    staging_bytes: Bytes = Field(
        default=64 * 2**20, gt=0, **with_fix("give a size such as '64MiB'")
    )

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> MlxSettings:
        options = extra.get(MLX_OPTIONS_KEY) or {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"kvtier: kv_connector_extra_config['{MLX_OPTIONS_KEY}']={options!r}; give a "
                "mapping (build the dict with kvtier.mlx.mlx_transfer_config())"
            )
        return cls.parse(options)
