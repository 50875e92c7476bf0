"""Honest tier sizing: how many tokens each tier holds, and the sizing trap.

The engine's KV pool and every kvtier tier are LRU caches over the same stream of blocks. A
tier that cannot hold more than the engine pool holds a subset of what the pool holds, so it
never serves a restore; worse, it fails silently (stores succeed, store metrics climb, restores
never happen). kvtier therefore refuses to start with such a tier (or warns, if the user opts
in with ``allow_small_tiers``), naming the numbers and a size that would work.

Units. Capacities are compared in *full-attention tokens*: the tokens whose KV a tier can hold
for every full-attention KV group of the model. For a model with one KV group (Llama, Qwen,
Mixtral...) that is simply tokens. For sliding-window models vLLM keeps one KV group per layer
type (its hybrid allocator); a sliding-window group needs only the last ``window`` tokens of a
prefix, so the host pool stores a few rows of it per stored prefix (not counted here) while the
engine pool spends blocks on it for every token until they are evicted (not counted either:
the engine figure is its most favourable reading, so the check errs on the safe side).

Exactness. ``rows = pool bytes // page-aligned bytes per chunk row`` and ``records = cap //
(4096-byte header + row bytes)`` are exact (they are how vLLM and the disk tier allocate).
From a ``config.json`` alone the grouping mirrors vLLM's (``_get_kv_cache_groups_uniform_page
_size``); inside the engine the guard uses vLLM's own numbers instead.

This module is pure: no vLLM, no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.format.record import HEADER_BYTES
from kvtier.units import format_size

PAGE_BYTES = 4096
DEFAULT_BLOCK_TOKENS = 128  # vLLM's CPU backend default block size

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
# Layer kinds that hold no attention KV in blocks; kvtier does not offload such models.
_NON_ATTENTION_KINDS = ("mamba", "linear", "conv", "recurrent", "ssm", "deltanet")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True, slots=True)
class KvGroup:
    """One KV cache group as vLLM forms it: layers of one attention type, same count each."""

    #: "full" or "sliding".
    kind: str
    #: Layers whose pages one block of this group holds (vLLM pads groups to equal size).
    layers: int
    #: Sliding window in tokens; None for full attention.
    window_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class KvLayout:
    """KV cache shape of a model: what one token costs and how layers are grouped."""

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    #: KV cache dtype name (``float32``, ``bfloat16``, ``float16``, ``fp8``...).
    kv_dtype: str
    groups: tuple[KvGroup, ...]

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype]

    @property
    def layer_bytes_per_token(self) -> int:
        """K and V of one layer for one token."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def group_layers(self) -> int:
        return self.groups[0].layers

    @property
    def num_full_groups(self) -> int:
        """Groups whose every token is stored; all groups if none is full attention."""
        full = sum(1 for g in self.groups if g.kind == "full")
        return full or len(self.groups)

    def block_bytes(self, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> int:
        """Bytes of one engine block (one group's layers, ``block_tokens`` tokens)."""
        return self.group_layers * self.layer_bytes_per_token * block_tokens

    def offloaded_bytes_per_token(self) -> int:
        """Bytes the tiers store per token: full-attention groups only (see module doc)."""
        return self.num_full_groups * self.group_layers * self.layer_bytes_per_token


def _layer_kinds(config: Mapping[str, Any], num_layers: int) -> list[tuple[str, int | None]]:
    """(kind, window) per layer, from ``layer_types`` or the older sliding-window keys."""
    window = config.get("sliding_window")
    layer_types = config.get("layer_types")
    if layer_types:
        kinds: list[tuple[str, int | None]] = []
        for name in layer_types[:num_layers]:
            name = str(name)
            if name in ("full_attention", "attention", "global_attention"):
                kinds.append(("full", None))
            elif name in ("sliding_attention", "local_attention", "chunked_attention"):
                if not window:
                    raise ConfigError(
                        f"config.json: layer type {name!r} but no sliding_window; cannot size"
                    )
                kinds.append(("sliding", int(window)))
            elif any(tag in name for tag in _NON_ATTENTION_KINDS):
                raise ConfigError(
                    f"config.json: layer type {name!r} keeps recurrent state, not attention KV; "
                    "kvtier offloads attention KV only and does not support this model"
                )
            else:
                raise ConfigError(f"config.json: unknown layer type {name!r}; cannot size")
        return kinds
    use_window = window and config.get("use_sliding_window", True)
    if use_window and int(window) < int(config.get("max_position_embeddings", 1 << 62)):
        # Mistral-style: every layer has the same window (one group, all sliding).
        return [("sliding", int(window))] * num_layers
    return [("full", None)] * num_layers


def group_layers(kinds: Sequence[tuple[str, int | None]]) -> tuple[KvGroup, ...]:
    """vLLM's grouping of a hybrid model's layers into equal-size KV groups."""
    buckets: dict[tuple[str, int | None], int] = {}
    for kind in kinds:
        buckets[kind] = buckets.get(kind, 0) + 1
    if len(buckets) == 1:
        (kind, window), count = next(iter(buckets.items()))
        return (KvGroup(kind, count, window),)
    smallest, largest = min(buckets.values()), max(buckets.values())
    size = largest if largest < smallest * 1.5 else smallest
    groups: list[KvGroup] = []
    # Full attention first, like the kinds' order in vLLM's spec dict for typical models.
    for (kind, window), count in sorted(buckets.items(), key=lambda kv: kv[0][0] != "full"):
        groups.extend(KvGroup(kind, size, window) for _ in range(math.ceil(count / size)))
    return tuple(groups)


def layout_from_config(
    config: Mapping[str, Any], kv_dtype: str = "auto", model: str = ""
) -> KvLayout:
    """The KV layout of a Hugging Face ``config.json`` (already parsed)."""
    config = config.get("text_config", config)
    if "kv_lora_rank" in config:
        raise ConfigError(
            "config.json: multi-head latent attention (kv_lora_rank) is not modelled by "
            "kvtier size; the engine's own guard still sizes it at start-up"
        )
    try:
        num_layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        hidden = int(config.get("hidden_size", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"config.json: missing or bad {exc}; is this a decoder model?") from exc
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    if kv_dtype == "auto":
        kv_dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    kv_dtype = kv_dtype.removeprefix("torch.")
    if kv_dtype not in DTYPE_BYTES:
        raise ConfigError(f"kv dtype {kv_dtype!r} is unknown; use one of {sorted(DTYPE_BYTES)}")
    groups = group_layers(_layer_kinds(config, num_layers))
    return KvLayout(model, num_layers, kv_heads, head_dim, kv_dtype, groups)


def layout_from_model_dir(model_dir: str | Path, kv_dtype: str = "auto") -> KvLayout:
    """The KV layout of a local model folder (reads ``config.json``)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} not found; give a local model folder") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it as JSON: {exc}") from exc
    return layout_from_config(config, kv_dtype, model=str(model_dir))


@dataclass(frozen=True, slots=True)
class TierCapacity:
    """What one tier holds: its size, its unit (block, row or record) and tokens."""

    name: str
    #: The option that sets this tier's size (named in messages).
    option: str
    capacity_bytes: int
    #: Bytes of one unit: an engine block, a host-pool row or a disk record.
    unit_bytes: int
    units: int
    #: Full-attention tokens held (see module doc).
    tokens: int


@dataclass(frozen=True, slots=True)
class RowGeometry:
    """How vLLM cuts tiers into units, from the engine's point of view."""

    #: Bytes of one engine block on one worker (vLLM's worker_kv_bytes_per_block).
    block_bytes: int
    block_tokens: int
    blocks_per_chunk: int = 1
    world_size: int = 1
    num_full_groups: int = 1

    @property
    def row_bytes(self) -> int:
        """Page-aligned bytes of one host-pool row (one chunk, every rank)."""
        return round_up(self.block_bytes * self.world_size * self.blocks_per_chunk, PAGE_BYTES)

    @property
    def tokens_per_row(self) -> int:
        return self.block_tokens * self.blocks_per_chunk

    def tokens(self, units: int, tokens_per_unit: int) -> int:
        return units * tokens_per_unit // max(self.num_full_groups, 1)

    def engine_pool(self, num_blocks: int, capacity_bytes: int | None = None) -> TierCapacity:
        """The engine's own KV pool: ``num_blocks`` blocks (of a pool of ``capacity_bytes``)."""
        return TierCapacity(
            "engine KV pool",
            "VLLM_CPU_KVCACHE_SPACE",
            # every rank holds its own blocks; total over ranks, like the host pool's size
            num_blocks * self.block_bytes * self.world_size
            if capacity_bytes is None
            else capacity_bytes,
            self.block_bytes,
            num_blocks,
            self.tokens(num_blocks, self.block_tokens),
        )

    def host_pool(self, pool_bytes: int) -> TierCapacity:
        rows = pool_bytes // self.row_bytes
        return TierCapacity(
            "host pool",
            "host_pool",
            pool_bytes,
            self.row_bytes,
            rows,
            self.tokens(rows, self.tokens_per_row),
        )

    def host_pool_rows(self, rows: int) -> TierCapacity:
        return self.host_pool(rows * self.row_bytes)

    def disk_tier(self, capacity_bytes: int) -> TierCapacity:
        record = HEADER_BYTES + self.row_bytes
        records = capacity_bytes // record
        return TierCapacity(
            "disk tier",
            "disk_capacity",
            capacity_bytes,
            record,
            records,
            self.tokens(records, self.tokens_per_row),
        )

    def bytes_for_tokens(self, tier: TierCapacity, tokens: int) -> int:
        """Smallest size of ``tier``'s kind that holds more than ``tokens``."""
        units = tokens * max(self.num_full_groups, 1) // self.tokens_per_row + 1
        if tier.option == "disk_capacity":
            return units * (HEADER_BYTES + self.row_bytes)
        return units * self.row_bytes


def geometry_for(
    layout: KvLayout, block_tokens: int = DEFAULT_BLOCK_TOKENS, blocks_per_chunk: int = 1
) -> RowGeometry:
    return RowGeometry(
        block_bytes=layout.block_bytes(block_tokens),
        block_tokens=block_tokens,
        blocks_per_chunk=blocks_per_chunk,
        num_full_groups=layout.num_full_groups,
    )


def engine_blocks(engine_kv_bytes: int, block_bytes: int) -> int:
    """Blocks vLLM's CPU backend carves out of ``VLLM_CPU_KVCACHE_SPACE``."""
    return engine_kv_bytes // block_bytes


def suggest_size(min_bytes: int) -> str:
    """A round size comfortably above ``min_bytes`` (twice it, rounded up), e.g. ``'2.5GiB'``."""
    target = 2 * min_bytes
    if target >= 2**30:
        return f"{round_up(target, 2**28) / 2**30:g}GiB"
    return f"{round_up(target, 2**20) // 2**20}MiB"


@dataclass(frozen=True, slots=True)
class SizingVerdict:
    """Outcome of the sizing check: the problems found (each a full sentence)."""

    traps: tuple[str, ...]
    notes: tuple[str, ...]


def check_tiers(
    engine: TierCapacity,
    tiers: Iterable[TierCapacity],
    geometry: RowGeometry,
) -> SizingVerdict:
    """Find tiers that cannot serve a restore (traps) and weaker sizing problems (notes)."""
    traps: list[str] = []
    notes: list[str] = []
    tiers = list(tiers)
    for tier in tiers:
        if tier.tokens > engine.tokens:
            continue
        need = geometry.bytes_for_tokens(tier, engine.tokens)
        traps.append(
            f"{tier.name}: {tier.option}={format_size(tier.capacity_bytes)} holds "
            f"{tier.tokens:,} tokens ({tier.units:,} x {format_size(tier.unit_bytes)}), no "
            f"more than the {engine.name} ({engine.tokens:,} tokens, "
            f"{format_size(engine.capacity_bytes)}); both are LRU over the same blocks, so "
            f"this tier would never serve a restore. Give {tier.option} more than "
            f"{format_size(need)}, e.g. {suggest_size(need)}, or shrink the engine pool"
        )
    host = next((t for t in tiers if t.option == "host_pool"), None)
    for tier in tiers:
        if tier.option == "disk_capacity" and host is not None and tier.tokens <= host.tokens:
            notes.append(
                f"{tier.name}: {tier.tokens:,} tokens is no more than the host pool's "
                f"{host.tokens:,}; within one run it holds nothing the host pool does not, "
                "so it only serves restarts. Give disk_capacity several times host_pool"
            )
    return SizingVerdict(tuple(traps), tuple(notes))


def enforce(verdict: SizingVerdict, allow_small_tiers: bool) -> list[str]:
    """Raise ``ConfigError`` for traps unless allowed; return the lines to log as warnings."""
    if verdict.traps and not allow_small_tiers:
        raise ConfigError(
            "kvtier: tier sizing trap: "
            + " | ".join(verdict.traps)
            + ". To start anyway, pass allow_small_tiers=True (--allow-small-tiers)"
        )
    return [*verdict.traps, *verdict.notes]
