"""Per-tier figures read from a vLLM server's ``/metrics`` text (what ``kvtier stats`` shows).

Pure arithmetic over one Prometheus text exposition: no HTTP, no vLLM import (prometheus_client's
parser ships with vLLM). Every figure is cumulative since the server started; a reader wanting
rates subtracts two views.

Where each figure comes from:

* tiers: vLLM's ``vllm:kv_offload_tiering_*`` label ``tier="N:<type>"`` (``0:primary`` is the
  host pool; kvtier's tiers are ``KvtierDiskTier`` and ``KvtierSharedTier``), joined with
  kvtier's own ``kvtier:tier_*`` whose label ``tier`` is a word (``disk``, ``shared``). A shared
  tier behind a disk tier is one vLLM tier (``KvtierDiskTier``) with two kvtier words: its row
  carries only kvtier's store figures.
* hit rate: ``chunk_hits / chunk_queries`` of the vLLM tier (None before any query).
* tokens restored: ``vllm:prompt_tokens_cached_by_source`` (``host`` for the host pool,
  ``disk`` for a storage tier: vLLM names every storage tier ``disk``, the shared tier too).
* prefill seconds per token: ``kvtier:prefill_seconds_per_token`` (the restore policy's
  measured estimate) when it is non-zero; otherwise vLLM's histograms,
  ``request_prefill_time_seconds_sum / request_prefill_kv_computed_tokens_sum`` (prefill time
  over the tokens it computed: it also counts restore time, so it overestimates). ``source``
  says which was used.
* time saved = tokens restored x prefill seconds per token: an estimate, not a measurement.

Samples of several engines (data parallel) are summed, gauges averaged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: vLLM tier type -> kvtier's word for it.
_TIER_WORDS = {"primary": "host pool", "KvtierDiskTier": "disk", "KvtierSharedTier": "shared"}
#: Order of rows: nearest the engine first.
_ORDER = ("host pool", "disk", "shared")
_QUERIES = "vllm:kv_offload_tiering_chunk_queries"
POLICY_SOURCE = "kvtier:prefill_seconds_per_token"
HISTOGRAM_SOURCE = (
    "vllm:request_prefill_time_seconds_sum / vllm:request_prefill_kv_computed_tokens_sum"
)


class MetricsFormatError(ValueError):
    """The text is not a Prometheus exposition."""


class Samples:
    """Samples of one exposition by name; counters under their own name (no ``_total``)."""

    def __init__(
        self,
        by_name: Mapping[str, list[tuple[dict[str, str], float]]],
        families: frozenset[str] = frozenset(),
    ) -> None:
        self._by_name = by_name
        #: Every family the text declares, with samples or not (a labelled counter has no
        #: sample before its first increment).
        self.families = families | frozenset(by_name)

    def names(self) -> set[str]:
        return set(self._by_name)

    def rows(self, name: str) -> list[tuple[dict[str, str], float]]:
        return list(self._by_name.get(name, []))

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``labels`` (None: none)."""
        values = [
            v for got, v in self.rows(name) if all(got.get(k) == x for k, x in labels.items())
        ]
        return sum(values) if values else None

    def mean(self, name: str, **labels: str) -> float | None:
        values = [
            v for got, v in self.rows(name) if all(got.get(k) == x for k, x in labels.items())
        ]
        return sum(values) / len(values) if values else None

    def label_values(self, name: str, label: str) -> list[str]:
        return sorted({got[label] for got, _ in self.rows(name) if label in got})


def parse(text: str) -> Samples:
    """Samples of a Prometheus text exposition (``_created`` samples dropped).

    Raises ``MetricsFormatError`` when the text does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    families: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            families.add(family.name)
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                name = family.name if sample.name == f"{family.name}_total" else sample.name
                by_name[name].append((dict(sample.labels), float(sample.value)))
    except ValueError as exc:  # the parser's only complaint about bad text
        raise MetricsFormatError(f"not a Prometheus exposition: {exc}") from None
    return Samples(dict(by_name), frozenset(families))


@dataclass
class TierFigures:
    """One tier's cumulative figures (None: the server does not expose it)."""

    tier: str  # "host pool", "disk", "shared", or vLLM's tier type for other tiers
    vllm_tier: str | None  # vLLM's label, e.g. "1:KvtierDiskTier"
    chunk_queries: float | None = None
    chunk_hits: float | None = None
    hit_rate: float | None = None
    source: str | None = None  # the prompt_tokens_cached_by_source source of its restores
    tokens_restored: float | None = None
    prefill_saved_s: float | None = None
    bytes_read: float | None = None  # restores out of this tier
    bytes_written: float | None = None  # stores into this tier
    read_seconds: float | None = None  # time spent on those restores
    restore_bytes_per_s: float | None = None
    load_failures: float | None = None
    quarantined: dict[str, float] = field(default_factory=dict)  # reason -> blocks
    stores_dropped: float | None = None
    loads_abandoned: float | None = None
    store_failures: float | None = None
    evicted: float | None = None
    used_bytes: float | None = None
    capacity_bytes: float | None = None


@dataclass
class View:
    """What ``kvtier stats`` shows: the tiers, where prompt tokens came from, time saved."""

    tiers: list[TierFigures]
    prompt_tokens: dict[str, float]  # prompt_tokens_by_source: local_compute, ...
    cached_tokens: dict[str, float]  # prompt_tokens_cached_by_source: device, host, disk, ...
    prefill_s_per_token: float | None
    prefill_source: str | None  # POLICY_SOURCE or HISTOGRAM_SOURCE
    tokens_restored: float
    prefill_saved_s: float | None
    #: The server declares vLLM's tiering metrics (False: offloading is off, not kvtier).
    offloading: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> View:
        """Inverse of ``to_dict`` (for recorded runs)."""
        fields = dict(data)
        fields["tiers"] = [TierFigures(**t) for t in data.get("tiers", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in fields.items() if k in known})


def _by_source(samples: Samples, name: str) -> dict[str, float]:
    return {
        source: samples.total(name, source=source) or 0.0
        for source in samples.label_values(name, "source")
    }


def _prefill_per_token(samples: Samples) -> tuple[float | None, str | None]:
    policy = [v for _, v in samples.rows(POLICY_SOURCE) if v > 0]
    if policy:
        return sum(policy) / len(policy), POLICY_SOURCE
    seconds = samples.total("vllm:request_prefill_time_seconds_sum")
    tokens = samples.total("vllm:request_prefill_kv_computed_tokens_sum")
    if seconds and tokens:
        return seconds / tokens, HISTOGRAM_SOURCE
    return None, None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _vllm_tier(samples: Samples, label: str) -> TierFigures:
    kind = label.split(":", 1)[-1]
    word = _TIER_WORDS.get(kind, kind)
    prefix = "vllm:kv_offload_tiering_"
    figures = TierFigures(tier=word, vllm_tier=label)
    figures.chunk_queries = samples.total(prefix + "chunk_queries", tier=label)
    figures.chunk_hits = samples.total(prefix + "chunk_hits", tier=label)
    figures.hit_rate = _ratio(figures.chunk_hits, figures.chunk_queries)
    if word == "host pool":
        figures.source = "host"
        # The host pool's restores and stores are the connector's own transfers.
        figures.bytes_read = samples.total("vllm:kv_offload_load_bytes")
        figures.read_seconds = samples.total("vllm:kv_offload_load_time")
        figures.bytes_written = samples.total("vllm:kv_offload_store_bytes")
        figures.load_failures = samples.total(prefix + "promotion_allocation_failures")
    else:
        figures.source = "disk"
        figures.bytes_read = samples.total(prefix + "read_bytes", tier=label)
        figures.read_seconds = samples.total(prefix + "read_time", tier=label)
        figures.bytes_written = samples.total(prefix + "write_bytes", tier=label)
        figures.load_failures = samples.total(prefix + "promotion_job_failures", tier=label)
        figures.store_failures = samples.total(prefix + "cascade_job_failures", tier=label)
        figures.stores_dropped = samples.total(prefix + "backpressure_blocks_dropped", tier=label)
    # vLLM's bytes over vLLM's time: kvtier's byte counters (which may replace bytes_read
    # below) count verified payloads, not the transfers vLLM timed.
    figures.restore_bytes_per_s = _ratio(figures.bytes_read, figures.read_seconds)
    return figures


def _add_kvtier(samples: Samples, figures: TierFigures, word: str) -> None:
    """kvtier's own figures of ``word`` override vLLM's where both exist (kvtier's count
    blocks and verified bytes; vLLM's count jobs)."""

    def get(name: str) -> float | None:
        return samples.total(name, tier=word)

    for attr, name in (
        ("bytes_read", "kvtier:tier_bytes_read"),
        ("bytes_written", "kvtier:tier_bytes_written"),
        ("load_failures", "kvtier:tier_load_failures"),
        ("stores_dropped", "kvtier:tier_stores_dropped"),
        ("loads_abandoned", "kvtier:tier_loads_abandoned"),
        ("store_failures", "kvtier:tier_store_failures"),
        ("evicted", "kvtier:tier_records_evicted"),
    ):
        value = get(name)
        if value is not None:
            setattr(figures, attr, value)
    figures.used_bytes = samples.mean("kvtier:tier_used_bytes", tier=word)
    capacity = samples.mean("kvtier:tier_capacity_bytes", tier=word)
    figures.capacity_bytes = capacity or None  # 0: the shared server's own business
    figures.quarantined = {}
    for reason in samples.label_values("kvtier:tier_records_quarantined", "reason"):
        count = samples.total("kvtier:tier_records_quarantined", tier=word, reason=reason)
        if count is not None:
            figures.quarantined[reason] = count


def _kvtier_words(samples: Samples) -> list[str]:
    words: set[str] = set()
    for name in samples.names():
        if name.startswith("kvtier:"):
            words.update(samples.label_values(name, "tier"))
    return sorted(words)


def build_view(samples: Samples) -> View:
    """The per-tier view of one exposition (see the module docstring for each figure)."""
    tiers = [_vllm_tier(samples, label) for label in samples.label_values(_QUERIES, "tier")]
    by_word = {t.tier: t for t in tiers}
    for word in _kvtier_words(samples):
        if word not in by_word:  # e.g. a shared tier behind the disk tier
            by_word[word] = TierFigures(tier=word, vllm_tier=None)
            tiers.append(by_word[word])
        _add_kvtier(samples, by_word[word], word)
    per_token, source = _prefill_per_token(samples)
    cached = _by_source(samples, "vllm:prompt_tokens_cached_by_source")
    for figures in tiers:
        if figures.vllm_tier is not None and figures.source is not None:
            figures.tokens_restored = cached.get(figures.source, 0.0)
            if per_token is not None:
                figures.prefill_saved_s = figures.tokens_restored * per_token
    tiers.sort(key=lambda t: (_ORDER.index(t.tier) if t.tier in _ORDER else len(_ORDER), t.tier))
    prompt = _by_source(samples, "vllm:prompt_tokens_by_source")
    restored = prompt.get("external_kv_transfer", 0.0)
    return View(
        tiers=tiers,
        prompt_tokens=prompt,
        cached_tokens=cached,
        prefill_s_per_token=per_token,
        prefill_source=source,
        tokens_restored=restored,
        prefill_saved_s=None if per_token is None else restored * per_token,
        offloading=_QUERIES in samples.families,
    )


def view_of(text: str) -> View:
    """``build_view(parse(text))``."""
    return build_view(parse(text))
