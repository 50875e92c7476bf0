"""kvtier: tiered, persistent, verified KV-cache offloading for vLLM."""

__version__ = "0.1.0"

from kvtier.transfer_config import kv_transfer_config

__all__ = ["kv_transfer_config"]
