"""The MLX paged KV cache layouts kvtier moves blocks of, and the arrays of each, in row order.

Two layouts exist in vllm-metal, and kvtier takes either (the engine says which, through
``MlxSettings.kv_layout``):

* ``layerwise`` (vllm-metal 0.3.0's ``MetalPagedKVCache``): per layer a key and a value array,
  each ``[num_blocks, block_size, num_kv_heads, head_dim]`` (fp16, bf16 or fp32), held in the
  lists ``key_caches`` and ``value_caches``;
* ``pages`` (vLLM's canonical page layout, which newer vllm-metal allocates): per KV tensor one
  ``uint8`` array ``[num_blocks, page_bytes]``, held in the list ``pages``.

A host-pool row holds, for each array in the order ``cache_slots`` gives (``k0, v0, k1, v1, ...``
or ``page0, page1, ...``), that array's bytes of ``blocks_per_chunk`` consecutive blocks. The two
layouts put the same KV in different bytes, so the layout is part of the disk tier's namespace
(``MlxKVLayout.namespace_name``): a record of one is never read as the other.

Blocks are read and written through the holder lists, never through raw pointers: an MLX index
assignment may reallocate an array's buffer (when a view shares it), and the list entry is the
one reference that always names the current array (``ArraySlot``).
"""

from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from enum import StrEnum
from math import prod
from typing import Any

import mlx.core as mx

from kvtier.errors import ConfigError


class MlxKVLayout(StrEnum):
    """How the engine's MLX cache lays out its blocks."""

    LAYERWISE = "layerwise"
    PAGES = "pages"

    @property
    def namespace_name(self) -> str:
        """The KV layout as the disk tier's namespace records it."""
        return f"mlx-{self.value}"


#: The element types vllm-metal's layerwise cache allows.
LAYERWISE_DTYPES = (mx.float16, mx.bfloat16, mx.float32)


@dataclass(frozen=True, slots=True)
class ArraySlot:
    """One array of the cache, named by the list that holds it, so a write can rebind it."""

    holder: MutableSequence[Any]
    index: int
    name: str  # for messages, e.g. "key_caches[3]"

    def get(self) -> mx.array:
        return self.holder[self.index]

    def set(self, array: mx.array) -> None:
        self.holder[self.index] = array


def block_bytes(array: mx.array) -> int:
    """Bytes of one block of ``array`` (its first dimension counts blocks)."""
    return prod(array.shape[1:]) * array.dtype.size


def cache_slots(cache: object, layout: MlxKVLayout) -> list[ArraySlot]:
    """The arrays of ``cache`` in host-row order; ``ConfigError`` if it is not ``layout``.

    Every array must have the same number of blocks: one engine block id names a block of each.
    """
    if layout is MlxKVLayout.LAYERWISE:
        keys = _array_list(cache, "key_caches", layout)
        values = _array_list(cache, "value_caches", layout)
        if len(keys) != len(values) or not keys:
            raise ConfigError(
                f"kvtier: the MLX cache has {len(keys)} key and {len(values)} value arrays; the "
                "layerwise layout needs one of each per layer"
            )
        slots = []
        for i in range(len(keys)):
            slots.append(ArraySlot(keys, i, f"key_caches[{i}]"))
            slots.append(ArraySlot(values, i, f"value_caches[{i}]"))
        _check_arrays(slots, 4, LAYERWISE_DTYPES, layout)
    else:
        pages = _array_list(cache, "pages", layout)
        if not pages:
            raise ConfigError("kvtier: the MLX cache has no pages; the pages layout needs some")
        slots = [ArraySlot(pages, i, f"pages[{i}]") for i in range(len(pages))]
        _check_arrays(slots, 2, (mx.uint8,), layout)
    return slots


def _array_list(cache: object, attribute: str, layout: MlxKVLayout) -> MutableSequence[Any]:
    arrays = getattr(cache, attribute, None)
    if not isinstance(arrays, MutableSequence):
        raise ConfigError(
            f"kvtier: the MLX cache {type(cache).__name__} has no list {attribute!r}, so it is "
            f"not in the {layout.value!r} layout; set the MLX option kv_layout to the layout "
            f"the engine allocates ({', '.join(repr(m.value) for m in MlxKVLayout)})"
        )
    return arrays


def _check_arrays(
    slots: Sequence[ArraySlot], ndim: int, dtypes: Sequence[Any], layout: MlxKVLayout
) -> None:
    for slot in slots:
        array = slot.get()
        if not isinstance(array, mx.array) or array.ndim != ndim or array.dtype not in dtypes:
            shape = getattr(array, "shape", None)
            raise ConfigError(
                f"kvtier: MLX cache array {slot.name} is {type(array).__name__} "
                f"{getattr(array, 'dtype', '?')} {shape}; the {layout.value!r} layout has "
                f"{ndim}-dimensional arrays of {', '.join(str(d) for d in dtypes)}"
            )
    blocks = {slot.get().shape[0] for slot in slots}
    if len(blocks) != 1:
        raise ConfigError(
            f"kvtier: the MLX cache's arrays have different block counts {sorted(blocks)}; one "
            "engine block id must name a block of every array"
        )
