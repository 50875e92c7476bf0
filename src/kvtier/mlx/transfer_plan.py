"""Which engine block goes to which host-pool row and sub-block, for one transfer.

The placement is the CPU data plane's (``kvtier.dataplane.host_layout``): a transfer's engine
blocks are logically consecutive blocks of one request, starting at block index ``k``; the
host side skips ``k % blocks_per_chunk`` sub-blocks of its first row and fills
``ceil((n + skip) / blocks_per_chunk)`` rows in order. An MLX cache is one KV group (vllm-metal
offers nothing else), so a transfer names one group.

Every id is checked against the cache and the pool before anything is copied: MLX's gather does
not check bounds, and a wrong id would read or overwrite another block.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class BlockMoves:
    """Engine block ``engine_blocks[i]`` <-> sub-block ``host_slots[i]`` of row ``host_rows[i]``."""

    engine_blocks: np.ndarray  # int64
    host_rows: np.ndarray  # int64
    host_slots: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.engine_blocks)

    def batches(self, max_blocks: int) -> Iterator["BlockMoves"]:
        """The moves in order, at most ``max_blocks`` at a time (bounds the staging memory)."""
        for start in range(0, len(self), max_blocks):
            end = start + max_blocks
            yield BlockMoves(
                self.engine_blocks[start:end], self.host_rows[start:end], self.host_slots[start:end]
            )


def plan_moves(
    engine_block_ids: np.ndarray,
    group_sizes: Sequence[int],
    block_indices: Sequence[int],
    host_row_ids: np.ndarray,
    blocks_per_chunk: int,
    num_engine_blocks: int,
    num_host_rows: int,
) -> BlockMoves:
    """The moves of one transfer; ``ValueError`` when the ids do not fit the cache or pool."""
    if len(group_sizes) != 1 or len(block_indices) != 1:
        raise ValueError(
            f"an MLX cache is one KV group, but the transfer names {len(group_sizes)} groups"
        )
    n = len(engine_block_ids)
    if group_sizes[0] != n:
        raise ValueError(f"group size {group_sizes[0]} for {n} engine blocks")
    skip = int(block_indices[0]) % blocks_per_chunk
    rows_needed = -(-(n + skip) // blocks_per_chunk) if n else 0
    if len(host_row_ids) != rows_needed:
        raise ValueError(
            f"{n} engine blocks starting {skip} sub-blocks into a row need {rows_needed} host "
            f"rows, got {len(host_row_ids)}"
        )
    engine = np.asarray(engine_block_ids, dtype=np.int64)
    rows = np.asarray(host_row_ids, dtype=np.int64)
    _check_range("engine block", engine, num_engine_blocks)
    _check_range("host row", rows, num_host_rows)
    if len(np.unique(engine)) != n:
        raise ValueError("an engine block appears twice in one transfer")
    positions = np.arange(skip, skip + n, dtype=np.int64)
    return BlockMoves(engine, rows[positions // blocks_per_chunk], positions % blocks_per_chunk)


def _check_range(what: str, ids: np.ndarray, count: int) -> None:
    if len(ids) and (ids.min() < 0 or ids.max() >= count):
        bad = ids[(ids < 0) | (ids >= count)]
        raise ValueError(f"{what} id(s) {bad[:8].tolist()} outside [0, {count})")
