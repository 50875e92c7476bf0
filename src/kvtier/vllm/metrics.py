"""kvtier's own Prometheus metrics, emitted through vLLM's tier metric hooks.

vLLM exports per-tier offloading metrics itself (``vllm:kv_offload_tiering_*``, label
``tier="N:<type>"``: lookups, hits, bytes and time of promotions and cascades). A
``SecondaryTierManager`` may add its own definitions (``build_metric_definitions``) and report
observations (``get_stats``); vLLM registers them next to its own, on the same ``/metrics``
endpoint, with the engine's labels first. kvtier's tiers add what only the store knows, under
the label ``tier`` whose value says the tier in words (``disk``, ``shared``):

===================================  =======  ======  =========================================
name                                 type     unit    meaning
===================================  =======  ======  =========================================
kvtier:tier_records_stored           counter  blocks  records written by this engine
kvtier:tier_records_loaded           counter  blocks  verified records read into the host pool
kvtier:tier_records_evicted          counter  blocks  records dropped to stay under the cap
kvtier:tier_records_quarantined      counter  blocks  records that failed a check (``reason``)
kvtier:tier_load_failures            counter  blocks  loads that became misses (any cause)
kvtier:tier_store_failures           counter  blocks  stores the store refused or failed
kvtier:tier_stores_dropped           counter  blocks  stores dropped because the tier was busy
kvtier:tier_stores_skipped           counter  blocks  stores not written: no restore could pay
kvtier:tier_bytes_read               counter  bytes   payload bytes of verified loads
kvtier:tier_bytes_written            counter  bytes   record bytes written
kvtier:tier_page_cache_reads         counter  blocks  verified loads copied from the page cache
kvtier:tier_io_seconds               counter  s       time in store I/O (``direction``)
kvtier:tier_reconnects               counter  events  reconnects to the shared tier's server
kvtier:tier_used_bytes               gauge    bytes   bytes held under the cap (all engines)
kvtier:tier_capacity_bytes           gauge    bytes   the cap (0: the server's business)
kvtier:tier_loads_abandoned          counter  blocks  loads abandoned at their deadline
kvtier:tier_loads_stuck              gauge    blocks  abandoned loads still holding an I/O thread
kvtier:restore_decisions             counter  reqs    per-request verdicts (``verdict``)
kvtier:tier_estimated_bandwidth      gauge    B/s     the policy's restore bandwidth estimate
kvtier:tier_slow                     gauge    0/1     the tier overran a deadline, not recovered
kvtier:prefill_seconds_per_token     gauge    s       predicted prefill s/token (2k, cold)
kvtier:decision_evidence_files       counter  files   evidence files adopted / ignored / unsaved
===================================  =======  ======  =========================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

STORED = "kvtier:tier_records_stored"
LOADED = "kvtier:tier_records_loaded"
EVICTED = "kvtier:tier_records_evicted"
QUARANTINED = "kvtier:tier_records_quarantined"
LOAD_FAILURES = "kvtier:tier_load_failures"
STORE_FAILURES = "kvtier:tier_store_failures"
STORES_DROPPED = "kvtier:tier_stores_dropped"
STORES_SKIPPED = "kvtier:tier_stores_skipped"
BYTES_READ = "kvtier:tier_bytes_read"
BYTES_WRITTEN = "kvtier:tier_bytes_written"
PAGE_CACHE_READS = "kvtier:tier_page_cache_reads"
IO_SECONDS = "kvtier:tier_io_seconds"
RECONNECTS = "kvtier:tier_reconnects"
USED_BYTES = "kvtier:tier_used_bytes"
CAPACITY_BYTES = "kvtier:tier_capacity_bytes"
ABANDONED = "kvtier:tier_loads_abandoned"
STUCK = "kvtier:tier_loads_stuck"
DECISIONS = "kvtier:restore_decisions"
EST_BANDWIDTH = "kvtier:tier_estimated_bandwidth"
SLOW = "kvtier:tier_slow"
PREFILL_PER_TOKEN = "kvtier:prefill_seconds_per_token"
EVIDENCE_FILES = "kvtier:decision_evidence_files"

_TIER = ("tier",)


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """Definitions of every kvtier tier metric (the same for every kvtier tier)."""

    def counter(doc: str, labels: tuple[str, ...] = _TIER) -> OffloadingCounterMetadata:
        return OffloadingCounterMetadata(documentation=doc, labelnames=labels)

    def gauge(doc: str) -> OffloadingGaugeMetadata:
        return OffloadingGaugeMetadata(documentation=doc, labelnames=_TIER)

    return {
        STORED: counter("Blocks this engine wrote to the kvtier tier."),
        LOADED: counter("Verified blocks read from the kvtier tier into the host pool."),
        EVICTED: counter("Blocks the kvtier tier dropped to stay under its cap."),
        QUARANTINED: counter(
            "Blocks that failed a check (checksum, header, namespace, ...) and were "
            "quarantined or deleted, by reason.",
            ("tier", "reason"),
        ),
        LOAD_FAILURES: counter("Block loads that became misses and were recomputed."),
        STORE_FAILURES: counter("Block stores the kvtier tier refused or failed."),
        STORES_DROPPED: counter(
            'Block stores dropped because the tier could not keep up; under tier="shared" '
            "behind a disk tier: blocks written to the disk but not to the server, which fell "
            "behind."
        ),
        STORES_SKIPPED: counter(
            "Block stores not written because no restore from the tier could beat the "
            "engine's prefill at any prompt length it takes, while the decision is on (one "
            "store job is still written per probe interval, to keep measuring the tier)."
        ),
        BYTES_READ: counter("Payload bytes of verified loads from the kvtier tier."),
        BYTES_WRITTEN: counter("Record bytes written to the kvtier tier."),
        PAGE_CACHE_READS: counter(
            "Verified loads the disk tier copied from the page cache, which held the whole "
            "record, instead of reading it from the device (records are written and read "
            "O_DIRECT, so this stays 0 unless something else left them cached)."
        ),
        IO_SECONDS: counter(
            "Seconds the kvtier tier's threads spent in store I/O, by direction.",
            ("tier", "direction"),
        ),
        RECONNECTS: counter("Reconnects of the shared tier to its server."),
        USED_BYTES: gauge("Bytes held under the kvtier tier's cap (every engine sharing it)."),
        CAPACITY_BYTES: gauge("Byte cap of the kvtier tier (0: capacity is the server's)."),
        ABANDONED: counter("Block loads abandoned at their deadline (then recomputed)."),
        STUCK: gauge(
            "Abandoned block loads still running in an I/O thread (a read stuck in the "
            "kernel or on a lock); while every read thread is held so, lookups miss."
        ),
        DECISIONS: counter(
            "Requests whose tier hit was restored or recomputed, by verdict (restore, "
            "recompute, unmeasured: restored before prefill was measured, off: decision off).",
            ("tier", "verdict"),
        ),
        EST_BANDWIDTH: gauge(
            "The restore policy's bandwidth estimate of the tier (what predictions of large "
            "loads use: the fit, capped at the throughput the tier showed), bytes/s."
        ),
        SLOW: gauge("1 while the tier is marked slow after overrunning a load deadline."),
        PREFILL_PER_TOKEN: gauge(
            "The restore policy's prefill estimate: seconds per token of a cold 2,048-token "
            "prefill (0 until measured)."
        ),
        EVIDENCE_FILES: counter(
            "The restore decision's evidence files in the tier's folder, by outcome (loaded: "
            "an earlier process's measurements adopted at start-up; ignored: damaged, another "
            "format version or measured on another device or setup; write_failed: a save "
            "that failed).",
            ("tier", "outcome"),
        ),
    }


@dataclass
class TierSnapshot:
    """Cumulative figures of one tier at one moment (counters only grow)."""

    counters: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)
    gauges: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)


def snapshot(
    tier_word: str,
    stores: list[tuple[str, Any]],
    tier_counters: Any,
    gauges: dict[str, float],
    server_parts: Sequence[str] = (),
) -> TierSnapshot:
    """Cumulative figures from a tier's ``TierCounters`` (under ``tier_word``) and the
    ``StoreStats`` of each of its stores (under the store's own word); stores whose server
    part alone was dropped count under the word of each part on a server
    (``server_parts``)."""
    label = (tier_word,)
    counters: dict[tuple[str, tuple[str, ...]], float] = {
        (ABANDONED, label): tier_counters.loads_abandoned,
        (STORED, label): tier_counters.stores,
        (LOADED, label): tier_counters.loads,
        (LOAD_FAILURES, label): tier_counters.load_failures,
        (STORES_DROPPED, label): tier_counters.stores_dropped,
        (STORES_SKIPPED, label): tier_counters.stores_skipped,
        (IO_SECONDS, (tier_word, "read")): tier_counters.read_seconds,
        (IO_SECONDS, (tier_word, "write")): tier_counters.write_seconds,
    }
    for word in server_parts:
        counters[(STORES_DROPPED, (word,))] = tier_counters.server_stores_dropped
    for word, store_stats in stores:
        store_label = (word,)
        counters[(EVICTED, store_label)] = store_stats.evictions
        counters[(STORE_FAILURES, store_label)] = store_stats.put_failures
        counters[(BYTES_READ, store_label)] = store_stats.bytes_read
        counters[(BYTES_WRITTEN, store_label)] = store_stats.bytes_written
        counters[(PAGE_CACHE_READS, store_label)] = store_stats.page_cache_hits
        counters[(RECONNECTS, store_label)] = getattr(store_stats, "reconnects", 0)
        for reason, count in Counter(store_stats.corrupt).items():
            counters[(QUARANTINED, (word, reason))] = count
    gauge_values = {(name, label): value for name, value in gauges.items()}
    gauge_values[(STUCK, label)] = float(tier_counters.loads_stuck)
    return TierSnapshot(counters=counters, gauges=gauge_values)


def delta_stats(before: TierSnapshot, now: TierSnapshot) -> OffloadingConnectorStats | None:
    """vLLM's stats payload for what changed between two snapshots (None: nothing did)."""
    stats = OffloadingConnectorStats()
    for (name, labels), value in now.counters.items():
        increase = value - before.counters.get((name, labels), 0)
        if increase > 0:
            stats.increase_counter(name, increase, labels)
    for (name, labels), value in now.gauges.items():
        stats.set_gauge(name, value, labels)
    return None if stats.is_empty() else stats
