"""Where prompt tokens came from: the server's counters, read from ``/metrics`` around a run.

The figures are vLLM's ``prompt_tokens_by_source`` (computed, engine prefix cache, restored by
a KV connector), ``prompt_tokens_cached_by_source`` (engine, host pool, storage tiers) and
kvtier's per-tier counters, each as the growth over a run. A server restart zeroes its
counters, so the runner reads them at the start and end of each segment (before and after the
command between rounds) and adds the segments' growths; a counter lower at the end than at the
start of a segment was reset inside it, and counts from zero (Prometheus's own rule).

A server without these metrics (not vLLM, or metrics off) gives empty figures, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtier.metrics_view import MetricsFormatError, Samples, parse

#: Counter family -> the labels that split it (other labels, e.g. the engine, are summed).
COUNTERS: dict[str, tuple[str, ...]] = {
    "vllm:prompt_tokens_by_source": ("source",),
    "vllm:prompt_tokens_cached_by_source": ("source",),
    "vllm:kv_offload_tiering_chunk_queries": ("tier",),
    "vllm:kv_offload_tiering_chunk_hits": ("tier",),
    "kvtier:tier_bytes_read": ("tier",),
    "kvtier:tier_bytes_written": ("tier",),
    "kvtier:restore_decisions": ("verdict",),
}


def counters(text: str | None) -> dict[str, float]:
    """``{"family{label=value}": total}`` of the families in ``COUNTERS`` ({} when ``text`` is
    None or not a Prometheus exposition)."""
    if text is None:
        return {}
    try:
        samples = parse(text)
    except MetricsFormatError:
        return {}
    out: dict[str, float] = {}
    for family, split in COUNTERS.items():
        for labels, value in samples.rows(family):
            key = family + "{" + ",".join(f"{k}={labels.get(k, '')}" for k in split) + "}"
            out[key] = out.get(key, 0.0) + value
    return out


def pool_tokens(text: str | None) -> int | None:
    """Tokens the engine's own KV cache holds (``vllm:cache_config_info``'s ``num_gpu_blocks``
    x ``block_size``, summed over engines); None when the server does not say."""
    if text is None:
        return None
    try:
        samples: Samples = parse(text)
    except MetricsFormatError:
        return None
    total = 0
    for labels, _ in samples.rows("vllm:cache_config_info"):
        try:
            total += int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            continue
    return total or None


def growth(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """How much each counter of ``after`` grew since ``before`` (a counter that went down was
    reset in between, by a restart, and its growth is its value)."""
    out = {}
    for key, value in after.items():
        start = before.get(key, 0.0)
        out[key] = value - start if value >= start else value
    return out


def add(total: dict[str, float], more: Mapping[str, float]) -> dict[str, float]:
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + value
    return total


#: Rows of the results' "prompt tokens by source": label -> counter key.
SOURCES = {
    "computed": "vllm:prompt_tokens_by_source{source=local_compute}",
    "engine cache": "vllm:prompt_tokens_by_source{source=local_cache_hit}",
    "restored": "vllm:prompt_tokens_by_source{source=external_kv_transfer}",
    "host pool": "vllm:prompt_tokens_cached_by_source{source=host}",
    "disk": "vllm:prompt_tokens_cached_by_source{source=disk}",
}
