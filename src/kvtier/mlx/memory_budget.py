"""The host pool and the copy's staging, fitted together into the RAM the machine can spare.

On unified memory (Apple silicon) the pool's pages, the staging buffers and MLX's KV cache are
one memory, so the pool is budgeted as RAM whatever file backs it. The budget is the CPU
backend's (``kvtier.hostpool.ram_guard``: headroom less a floor of 10 % of RAM, 256 MiB..4 GiB), run
when the engine's cache is already allocated, less the staging a transfer can hold
(``STAGING_COPIES`` x ``MlxSettings.staging_bytes``).

Where live memory cannot be read (``/proc/meminfo`` is Linux's; macOS has none), the pool is
not clamped and a warning says so: an unverifiable clamp would be a guess.
"""

import logging
from collections.abc import Callable

from kvtier.errors import ConfigError
from kvtier.hostpool.ram_guard import (
    MemorySnapshot,
    PoolClamp,
    clamp_host_pool,
    free_ram_floor,
    read_memory,
)
from kvtier.units import format_size

logger = logging.getLogger(__name__)

#: Buffers of ``staging_bytes`` a load holds at once: the rows read out of the pool and the
#: MLX array built from them (a store's gathered blocks are one buffer, viewed without a copy).
STAGING_COPIES = 2


def clamp_pool_and_staging(
    requested_rows: int,
    row_bytes: int,
    staging_bytes: int,
    snapshot: MemorySnapshot,
    floor_bytes: int | None = None,
) -> PoolClamp:
    """The pool's rows such that rows x ``row_bytes`` + the staging fit the RAM budget.

    Raises ``ConfigError`` when not one row fits beside the staging.
    """
    if floor_bytes is None:
        floor_bytes = free_ram_floor(snapshot.effective_total_bytes)
    staging = STAGING_COPIES * staging_bytes
    try:
        clamp = clamp_host_pool(
            requested_rows * row_bytes, row_bytes, snapshot, floor_bytes + staging
        )
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}. The MLX data plane also keeps {format_size(staging)} for staging "
            "(2 x staging_bytes): lower staging_bytes or host_pool"
        ) from None
    return PoolClamp(
        clamp.pool_bytes,
        clamp.rows,
        clamp.clamped,
        f"{clamp.message}; the floor includes {format_size(staging)} of MLX staging",
    )


def decide_pool_rows(
    requested_rows: int,
    row_bytes: int,
    staging_bytes: int,
    read: Callable[[], MemorySnapshot] = read_memory,
) -> int:
    """The worker's row count: clamped to RAM with the staging counted, logged once."""
    try:
        snapshot = read()
    except OSError as exc:
        logger.warning(
            "kvtier: cannot read live memory here (%s); the MLX host pool of %s and its "
            "%s of staging are not checked against RAM",
            exc,
            format_size(requested_rows * row_bytes),
            format_size(STAGING_COPIES * staging_bytes),
        )
        return requested_rows
    clamp = clamp_pool_and_staging(requested_rows, row_bytes, staging_bytes, snapshot)
    (logger.warning if clamp.clamped else logger.info)("%s", clamp.message)
    return clamp.rows
