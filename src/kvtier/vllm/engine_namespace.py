"""The disk tier's namespace for one engine: what must match for stored KV to be reused.

Built from vLLM's ``OffloadingConfig`` or its shape on releases without one
(``kvtier.vllm.compat.offloading_view``: model, KV dtype, groups and their layers, tokens per
block and per hash, bytes per chunk row, parallel layout), the model folder (KV heads, head size,
a weights fingerprint) and the block-hash seed (``NONE_HASH``, which folds in the prefix-caching
hash algorithm and its seed). A change in any of them gives another namespace, stored in another
folder and never served to this engine.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

from kvtier.format import Namespace

# Weights are fingerprinted by name, size and the first and last MiB of each file: cheap at
# start-up, and it changes when a fine-tune or re-quantisation replaces the weights in place.
_FINGERPRINT_SPAN = 1 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def weights_fingerprint(model: str) -> str:
    """Digest of a local model folder's config and weight files; "" for a non-local model."""
    folder = Path(model)
    if not folder.is_dir():
        return ""
    digest = hashlib.sha256()
    config = folder / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for path in sorted(folder.iterdir()):
        if path.suffix not in _WEIGHT_SUFFIXES or not path.is_file():
            continue
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            digest.update(f.read(_FINGERPRINT_SPAN))
            if size > _FINGERPRINT_SPAN:
                f.seek(max(size - _FINGERPRINT_SPAN, _FINGERPRINT_SPAN))
                digest.update(f.read(_FINGERPRINT_SPAN))
    return digest.hexdigest()[:32]


def _model_shape(model: str) -> tuple[int, int, int]:
    """(layers, kv heads, head size) from a local config.json; zeros when unknown."""
    config_path = Path(model) / "config.json"
    try:
        config: dict[str, Any] = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return 0, 0, 0
    config = config.get("text_config", config)
    layers = int(config.get("num_hidden_layers", 0))
    heads = int(config.get("num_attention_heads", 0))
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_size = int(config.get("head_dim") or (config.get("hidden_size", 0) // max(heads, 1)))
    return layers, kv_heads, head_size


class BlockHashNotReady(RuntimeError):
    """vLLM has not seeded its block hashes yet (it does so after building the scheduler)."""


def block_hash_identity() -> str:
    """Fingerprint of the engine's block-hash seed (``NONE_HASH``); needs an initialised engine.

    vLLM seeds the chain of block hashes with ``NONE_HASH``, derived from the hash algorithm and
    ``PYTHONHASHSEED`` (or a fixed seed for sha256, a random one for xxhash). Blocks hashed under
    another seed are different keys, so the seed belongs in the namespace.
    """
    from vllm.v1.core import kv_cache_utils

    none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
    if none_hash is None:
        raise BlockHashNotReady("vLLM's NONE_HASH is not initialised yet")
    return hashlib.sha256(bytes(none_hash)).hexdigest()[:32]


def build_namespace(config: Any, row_bytes: int) -> Namespace:
    """``config``: 0.32's ``OffloadingConfig`` or its shape (``compat.offloading_view``)."""
    layers, kv_heads, head_size = _model_shape(config.model.name)
    parallel = config.parallel
    groups = [{"tokens": g.tokens_per_block, "layers": list(g.layer_names)} for g in config.groups]
    return Namespace(
        model=config.model.name,
        weights_fingerprint=weights_fingerprint(config.model.name),
        kv_dtype=str(config.model.dtype),
        block_size_tokens=config.groups[0].tokens_per_block if config.groups else 0,
        num_groups=len(config.groups),
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_size=head_size,
        block_bytes=row_bytes,
        hash_algorithm=f"vllm-none-hash:{block_hash_identity()}",
        extra={
            "engine": "vllm",
            "groups": hashlib.sha256(json.dumps(groups).encode()).hexdigest()[:16],
            "tokens_per_hash": str(config.cache.tokens_per_hash),
            "blocks_per_chunk": str(config.cache.blocks_per_chunk),
            "worker_kv_bytes_per_block": str(config.worker_kv_bytes_per_block),
            "world_size": str(parallel.world_size),
            "tp_pp_pcp_dcp": f"{parallel.tp_size}/{parallel.pp_size}/"
            f"{parallel.pcp_size}/{parallel.dcp_size}",
            "kv_cache_layout": str(config.kv_cache_layout),
        },
    )
