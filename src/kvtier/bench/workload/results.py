"""The figures of one run: latency percentiles, throughput, per-round TTFT, token sources.

Percentiles are by nearest rank (``kvtier.bench.report.quantile``) over the answered requests;
the inter-token latency pools every gap of every request (as vLLM's serving benchmark does).
Throughput counts the time the segments ran, not the command between them. Failed requests
are counted, and left out of every latency figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtier.bench.report import quantile
from kvtier.bench.workload import metrics
from kvtier.bench.workload.runner import RunRecord, Sent


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """p50, p90, p99 and the count of ``values`` (None for none)."""
    if not values:
        return None
    return {
        "p50": quantile(values, 0.5),
        "p90": quantile(values, 0.9),
        "p99": quantile(values, 0.99),
        "count": len(values),
    }


def _ok(sent: Sequence[Sent]) -> list[Sent]:
    return [s for s in sent if s.completion.error is None]


def _times(sent: Sequence[Sent], name: str) -> list[float]:
    """``name`` (``ttft_s`` or ``e2e_s``) of every request that has it."""
    values = (getattr(s.completion, name) for s in sent)
    return [v for v in values if v is not None]


def per_round(sent: Sequence[Sent]) -> list[dict[str, Any]]:
    """Per round: requests, TTFT percentiles, prompt and cached tokens (from ``usage``)."""
    rounds = sorted({s.round for s in sent})
    rows = []
    for r in rounds:
        mine = [s for s in sent if s.round == r]
        ok = _ok(mine)
        cached = [s.completion.cached_tokens for s in ok if s.completion.cached_tokens is not None]
        rows.append(
            {
                "round": r,
                "requests": len(mine),
                "failed": len(mine) - len(ok),
                "ttft_s": percentiles(_times(ok, "ttft_s")),
                "prompt_tokens": sum(s.completion.prompt_tokens or 0 for s in ok),
                "cached_tokens": sum(cached) if cached else None,
            }
        )
    return rows


def sources(record: RunRecord) -> dict[str, Any]:
    """The counters' growth over the run (segments added) and the rows of ``SOURCES`` found."""
    total: dict[str, float] = {}
    for segment in record.segments:
        metrics.add(total, segment.counters)
    by_source = {label: total[key] for label, key in metrics.SOURCES.items() if key in total}
    return {"prompt_tokens": by_source, "counters": total}


def summarize(record: RunRecord, unique: bool = False) -> dict[str, Any]:
    """Every figure of the run (what the JSON keeps and the table shows); ``unique``: every
    prompt was unique (the no-reuse workload), for the working set."""
    ok = _ok(record.sent)
    duration = sum(seg.end_s - seg.start_s for seg in record.segments)
    prompt = sum(s.completion.prompt_tokens or 0 for s in ok)
    output = sum(s.completion.completion_tokens or 0 for s in ok)
    gaps = [g for s in ok for g in s.completion.itl_s]
    return {
        "requests": len(record.sent),
        "failed": len(record.sent) - len(ok),
        "duration_s": duration,
        "command_s": record.command_s,
        "ttft_s": percentiles(_times(ok, "ttft_s")),
        "itl_s": percentiles(gaps),
        "e2e_s": percentiles(_times(ok, "e2e_s")),
        "requests_per_s": len(ok) / duration if duration > 0 else None,
        "output_tokens_per_s": output / duration if duration > 0 else None,
        "prompt_tokens_per_s": prompt / duration if duration > 0 else None,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "pool_tokens": record.pool_tokens,
        "working_set_tokens": working_set(ok, unique),
        "rounds": per_round(record.sent),
        "sources": sources(record),
    }


def working_set(sent: Sequence[Sent], unique: bool = False) -> int:
    """Distinct tokens the run's prompts and answers took: each unit's longest prompt plus its
    answer (a chat user's last round holds every earlier one; a document's questions share
    it), or every request's for a workload whose prompts are all ``unique``."""
    longest: dict[tuple[int, int], int] = {}
    for s in sent:
        key = (s.unit, s.round if unique else 0)
        tokens = (s.completion.prompt_tokens or 0) + (s.completion.completion_tokens or 0)
        longest[key] = max(longest.get(key, 0), tokens)
    return sum(longest.values())
