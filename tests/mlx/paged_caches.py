"""MLX paged KV caches in vllm-metal's two layouts, owned by the tests (no vllm-metal import).

``LayerwiseCache`` has the attributes of vllm-metal 0.3.0's ``MetalPagedKVCache`` that kvtier
reads (``key_caches``, ``value_caches``: per layer ``[num_blocks, block_size, kv_heads,
head_dim]``); ``PagesCache`` holds vLLM's canonical pages (``pages``: per layer ``uint8``
``[num_blocks, page_bytes]``, a page being the block's keys then its values). Both write and
read tokens' KV through a block table the way an engine's ``reshape_and_cache`` and paged
attention would, in plain MLX.
"""

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np


@dataclass
class CacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: mx.Dtype = mx.float32

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over every layer, keys and values (vLLM's per-block figure)."""
        return (
            2 * self.num_layers * self.block_size * self.kv_heads * self.head_dim * self.dtype.size
        )


def _slots(
    block_table: list[int], positions: np.ndarray, block_size: int
) -> tuple[mx.array, mx.array]:
    table = np.asarray(block_table, dtype=np.int64)
    return mx.array(table[positions // block_size]), mx.array(positions % block_size)


@dataclass
class LayerwiseCache:
    shape: CacheShape
    key_caches: list[mx.array] = field(default_factory=list)
    value_caches: list[mx.array] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.shape
        dims = (s.num_blocks, s.block_size, s.kv_heads, s.head_dim)
        self.key_caches = [mx.zeros(dims, dtype=s.dtype) for _ in range(s.num_layers)]
        self.value_caches = [mx.zeros(dims, dtype=s.dtype) for _ in range(s.num_layers)]
        mx.eval(self.key_caches, self.value_caches)

    def write(
        self, layer: int, block_table: list[int], positions: np.ndarray, k: mx.array, v: mx.array
    ) -> None:
        """Keys and values ``[n, kv_heads, head_dim]`` of tokens at ``positions``."""
        blocks, offsets = _slots(block_table, positions, self.shape.block_size)
        self.key_caches[layer][blocks, offsets] = k.astype(self.shape.dtype)
        self.value_caches[layer][blocks, offsets] = v.astype(self.shape.dtype)
        mx.eval(self.key_caches[layer], self.value_caches[layer])

    def read(
        self, layer: int, block_table: list[int], positions: np.ndarray
    ) -> tuple[mx.array, mx.array]:
        blocks, offsets = _slots(block_table, positions, self.shape.block_size)
        return self.key_caches[layer][blocks, offsets], self.value_caches[layer][blocks, offsets]

    def arrays(self) -> list[mx.array]:
        return [a for pair in zip(self.key_caches, self.value_caches, strict=True) for a in pair]


@dataclass
class PagesCache:
    shape: CacheShape
    pages: list[mx.array] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.shape
        page = self.shape.block_bytes // s.num_layers
        self.pages = [mx.zeros((s.num_blocks, page), dtype=mx.uint8) for _ in range(s.num_layers)]
        mx.eval(self.pages)

    def _typed(self, layer: int) -> mx.array:
        s = self.shape
        return mx.view(self.pages[layer], s.dtype).reshape(
            s.num_blocks, 2, s.block_size, s.kv_heads, s.head_dim
        )

    def write(
        self, layer: int, block_table: list[int], positions: np.ndarray, k: mx.array, v: mx.array
    ) -> None:
        blocks, offsets = _slots(block_table, positions, self.shape.block_size)
        typed = self._typed(layer)
        typed[blocks, 0, offsets] = k.astype(self.shape.dtype)
        typed[blocks, 1, offsets] = v.astype(self.shape.dtype)
        self.pages[layer] = mx.view(typed.reshape(self.shape.num_blocks, -1), mx.uint8)
        mx.eval(self.pages[layer])

    def read(
        self, layer: int, block_table: list[int], positions: np.ndarray
    ) -> tuple[mx.array, mx.array]:
        blocks, offsets = _slots(block_table, positions, self.shape.block_size)
        typed = self._typed(layer)
        return typed[blocks, 0, offsets], typed[blocks, 1, offsets]

    def arrays(self) -> list[mx.array]:
        return list(self.pages)


def make_cache(layout: str, shape: CacheShape) -> LayerwiseCache | PagesCache:
    return LayerwiseCache(shape) if layout == "layerwise" else PagesCache(shape)
