"""``kvtier size``: what each tier holds for a model, and whether the sizing trap bites.

Reads the model's ``config.json`` only; starts no engine and imports no vLLM.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Column, Table

from kvtier.hostpool.sizing import (
    DEFAULT_BLOCK_TOKENS,
    KvLayout,
    SizingVerdict,
    TierCapacity,
    check_tiers,
    engine_blocks,
    geometry_for,
    layout_from_model_dir,
)
from kvtier.units import format_size, parse_size

ENGINE_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


def default_engine_kv() -> str | None:
    """The engine pool size vLLM's CPU backend would use: ``VLLM_CPU_KVCACHE_SPACE`` GiB."""
    value = os.environ.get(ENGINE_KV_ENV, "").strip()
    return f"{value}GiB" if value else None


def plan(
    model_dir: str,
    engine_kv: str,
    host_pool: str,
    disk_capacity: str | None,
    kv_dtype: str = "auto",
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    blocks_per_chunk: int = 1,
) -> tuple[KvLayout, list[TierCapacity], SizingVerdict]:
    """Layout, capacities (engine first) and verdict for one configuration."""
    layout = layout_from_model_dir(model_dir, kv_dtype)
    geometry = geometry_for(layout, block_tokens, blocks_per_chunk)
    engine_bytes = parse_size(engine_kv, "engine_kv")
    engine = geometry.engine_pool(engine_blocks(engine_bytes, geometry.block_bytes), engine_bytes)
    tiers = [geometry.host_pool(parse_size(host_pool, "host_pool"))]
    if disk_capacity is not None:
        tiers.append(geometry.disk_tier(parse_size(disk_capacity, "disk_capacity")))
    return layout, [engine, *tiers], check_tiers(engine, tiers, geometry)


def describe_layout(layout: KvLayout) -> str:
    kinds = ", ".join(
        f"{g.kind}" + (f" (window {g.window_tokens})" if g.window_tokens else "")
        for g in layout.groups
    )
    return (
        f"{layout.num_layers} layers, {layout.num_kv_heads} KV heads x {layout.head_dim}, "
        f"{layout.kv_dtype} KV: {format_size(layout.offloaded_bytes_per_token())} per token "
        f"offloaded; {len(layout.groups)} KV group(s) of {layout.group_layers} layer(s): {kinds}"
    )


def as_json(
    layout: KvLayout, capacities: list[TierCapacity], verdict: SizingVerdict
) -> dict[str, Any]:
    return {
        "layout": {
            **{k: v for k, v in asdict(layout).items() if k != "groups"},
            "groups": [asdict(g) for g in layout.groups],
            "offloaded_bytes_per_token": layout.offloaded_bytes_per_token(),
        },
        "tiers": [asdict(c) for c in capacities],
        "traps": list(verdict.traps),
        "notes": list(verdict.notes),
    }


def render(
    layout: KvLayout,
    capacities: list[TierCapacity],
    verdict: SizingVerdict,
    console: Console,
) -> None:
    """Rich table to ``console``: one row per tier, numbers right-aligned, binary units."""
    table = Table(
        "tier",
        Column("size", justify="right"),
        Column("unit", justify="right"),
        Column("units", justify="right"),
        Column("tokens", justify="right"),
        Column("x engine", justify="right"),
        "serves restores",
    )
    engine = capacities[0]
    units = {"engine KV pool": "block", "host pool": "row", "disk tier": "record"}
    trapped = {t.split(":", 1)[0] for t in verdict.traps}
    for cap in capacities:
        serves = "-" if cap is engine else "NO (sizing trap)" if cap.name in trapped else "yes"
        table.add_row(
            cap.name,
            format_size(cap.capacity_bytes),
            f"{format_size(cap.unit_bytes)}/{units.get(cap.name, 'unit')}",
            f"{cap.units:,}",
            f"{cap.tokens:,}",
            f"{cap.tokens / engine.tokens:.2f}" if engine.tokens else "-",
            serves,
        )
    console.print(f"{layout.model}: {describe_layout(layout)}", highlight=False)
    console.print(table)


def render_json(layout: KvLayout, capacities: list[TierCapacity], verdict: SizingVerdict) -> str:
    return json.dumps(as_json(layout, capacities, verdict), indent=2)
