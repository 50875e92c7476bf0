"""The disk tier's namespace for one engine: what must match for stored KV to be reused.

Built from vLLM's ``OffloadingConfig`` or its shape on releases without one
(``Release.offloading_view``: model, KV dtype, groups and their layers, tokens per
block and per hash, bytes per worker and chunk), the KV slices a record holds
(``kvtier.runtime.row_layout``: every head where records are head-major, so engines of every
tensor-parallel size share the TP=1 engine's records; elsewhere the head slices of the ranks,
not the world size and rank, so engines whose ranks hold the same slices share records),
the pipeline and context-parallel sizes, the model folder (KV heads, head size, a weights
fingerprint) and the block-hash seed (``NONE_HASH``, which folds in the prefix-caching hash
algorithm and its seed). A change in any of them gives another namespace, stored in another
folder and never served to this engine.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.format import Namespace
from kvtier.runtime.row_layout import RowLayout, head_major_units, row_layout

#: Version of the record's layout inside the namespace: the distinct KV slices of a row
#: (``kvtier.runtime.row_layout``), where records were whole host-pool rows before.
ROW_LAYOUT = "kv-slices-1"

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


@dataclass(frozen=True)
class ModelShape:
    """What the model folder's config.json says of the KV cache; zeros when unknown."""

    layers: int = 0
    kv_heads: int = 0
    head_size: int = 0
    #: Multi-head latent attention (``kv_lora_rank``): one latent, the same on every rank.
    latent: bool = False


def model_shape(model: str) -> ModelShape:
    """The KV shape of a local model folder (``ModelShape()`` for a non-local model)."""
    config_path = Path(model) / "config.json"
    try:
        config: dict[str, Any] = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return ModelShape()
    if not isinstance(config, dict):
        return ModelShape()
    config = config.get("text_config", config)
    layers = int(config.get("num_hidden_layers", 0))
    heads = int(config.get("num_attention_heads", 0))
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_size = int(config.get("head_dim") or (config.get("hidden_size", 0) // max(heads, 1)))
    latent = bool(config.get("kv_lora_rank"))
    return ModelShape(layers, kv_heads, head_size, latent)


def engine_row_layout(
    config: Any, replicated: bool, pool_row_bytes: int, by_heads: bool = True
) -> RowLayout:
    """The row layout of the engine of ``config`` (``OffloadingConfig`` or its shape).

    ``by_heads=False`` names every worker part by its rank: for a vLLM whose row slots are
    not known to follow the TP rank (0.25.1 places a worker by its device index)."""
    shape = model_shape(config.model.name) if by_heads else ModelShape()
    blocks_per_chunk = max(int(config.cache.blocks_per_chunk), 1)
    head_units = head_major_units(
        config.kv_cache_layout,
        str(config.model.dtype),
        [g.tokens_per_block for g in config.groups],
        sum(len(g.layer_names) for g in config.groups),
        shape.kv_heads,
        shape.head_size,
        int(config.parallel.tp_size),
        int(config.worker_kv_bytes_per_block),
        blocks_per_chunk,
    )
    return row_layout(
        config.parallel,
        int(config.worker_kv_bytes_per_block) * blocks_per_chunk,
        replicated,
        pool_row_bytes,
        shape.kv_heads,
        shape.latent,
        head_units,
    )


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


def build_namespace(config: Any, layout: RowLayout) -> Namespace:
    """``config``: vLLM's ``OffloadingConfig`` or its shape (``Release.offloading_view``);
    ``layout``: its rows' (``engine_row_layout``). Nothing here depends on the world size or
    the rank except through ``layout``, where the slices could not be named by heads."""
    shape = model_shape(config.model.name)
    parallel = config.parallel
    groups = [{"tokens": g.tokens_per_block, "layers": list(g.layer_names)} for g in config.groups]
    worker_bytes = int(config.worker_kv_bytes_per_block)
    if layout.record_slices:
        # A head-major record is what a TP=1 worker holds: name it by that worker's bytes, so
        # engines of every TP size share the TP=1 engine's namespace.
        worker_bytes = layout.record_bytes // max(int(config.cache.blocks_per_chunk or 1), 1)
    return Namespace(
        model=config.model.name,
        weights_fingerprint=weights_fingerprint(config.model.name),
        kv_dtype=str(config.model.dtype),
        block_size_tokens=config.groups[0].tokens_per_block if config.groups else 0,
        num_groups=len(config.groups),
        num_layers=shape.layers,
        num_kv_heads=shape.kv_heads,
        head_size=shape.head_size,
        block_bytes=layout.record_bytes,
        hash_algorithm=f"vllm-none-hash:{block_hash_identity()}",
        extra={
            "engine": "vllm",
            "groups": hashlib.sha256(json.dumps(groups).encode()).hexdigest()[:16],
            "tokens_per_hash": str(config.cache.tokens_per_hash),
            "blocks_per_chunk": str(config.cache.blocks_per_chunk),
            "worker_kv_bytes_per_block": str(worker_bytes),
            "row_layout": ROW_LAYOUT,
            "kv_slices": layout.named_slices,
            "slice_bytes": str(layout.named_slice_bytes),
            "latent": str(shape.latent).lower(),
            # Pipeline and context parallelism split layers and tokens, not heads: distinct.
            "pp_pcp_dcp": f"{parallel.pp_size}/{parallel.pcp_size}/{parallel.dcp_size}",
            "kv_cache_layout": str(config.kv_cache_layout),
        },
    )
