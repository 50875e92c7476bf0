"""``kvtier stats --plot``: the dashboard's panels drawn from a recorded run, as one PNG.

The same panels as docs/dashboard/kvtier-grafana.json: hit rate per tier, prompt tokens by
source, restore bandwidth, quarantines and failures, usage vs cap, prefill time saved.
Counters in a recording are cumulative; the bandwidth panel differences consecutive samples
(bytes moved / time spent moving them, per interval in which a tier restored anything).
matplotlib is a development requirement only, imported here and nowhere else.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtier.extras import require

SOURCES = {  # label -> (dict in a sample, key)
    "computed": ("prompt_tokens", "local_compute"),
    "engine cache": ("prompt_tokens", "local_cache_hit"),
    "host pool": ("cached_tokens", "host"),
    "disk": ("cached_tokens", "disk"),
}


def _tier(sample: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in sample.get("tiers", []) if t.get("tier") == name), None)


def _tier_names(samples: Sequence[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for sample in samples:
        for tier in sample.get("tiers", []):
            if tier["tier"] not in names:
                names.append(tier["tier"])
    return names


def _series(
    samples: Sequence[dict[str, Any]], name: str, field: str
) -> tuple[list[float], list[float]]:
    t0 = samples[0]["t"]
    xs, ys = [], []
    for sample in samples:
        tier = _tier(sample, name)
        if tier is not None and tier.get(field) is not None:
            xs.append(sample["t"] - t0)
            ys.append(float(tier[field]))
    return xs, ys


def _bandwidth(
    samples: Sequence[dict[str, Any]], name: str, bytes_field: str
) -> tuple[list[float], list[float]]:
    """Per interval: Δ restored bytes / Δ restore seconds (vLLM's timed transfers)."""
    t0 = samples[0]["t"]
    xs, ys = [], []
    for before, after in itertools.pairwise(samples):
        a, b = _tier(before, name), _tier(after, name)
        if a is None or b is None:
            continue
        moved = (b.get(bytes_field) or 0) - (a.get(bytes_field) or 0)
        spent = (b.get("read_seconds") or 0) - (a.get("read_seconds") or 0)
        if moved > 0 and spent > 0:
            xs.append(after["t"] - t0)
            ys.append(moved / spent / 1e9)
    return xs, ys


def plot_recording(samples: Sequence[dict[str, Any]], png: Path) -> None:
    """Draw the six panels of ``samples`` (a recorded run, oldest first) into ``png``."""
    require("bench", "kvtier stats --plot", ("matplotlib",))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = sorted(samples, key=lambda s: s["t"])
    t0 = samples[0]["t"]
    xs = [s["t"] - t0 for s in samples]
    tiers = _tier_names(samples)
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    (hit, tokens, bandwidth), (quarantine, usage, saved) = axes

    for name in tiers:
        x, y = _series(samples, name, "hit_rate")
        if y:
            hit.plot(x, [100 * v for v in y], marker=".", label=name)
    hit.set(title="Hit rate per tier (chunk hits / queries, cumulative)", ylabel="%", ylim=(0, 105))

    stacks = [
        [float(s.get(group, {}).get(key, 0.0)) for s in samples] for group, key in SOURCES.values()
    ]
    tokens.stackplot(xs, *stacks, labels=list(SOURCES), step="post")
    tokens.set(title="Prompt tokens by source (cumulative)", ylabel="tokens")

    for name in tiers:
        x, y = _bandwidth(samples, name, "bytes_read")
        if y:
            bandwidth.plot(
                x,
                y,
                marker="o",
                linestyle="none",
                label=f"{name} -> engine" if name == "host pool" else f"{name} -> host pool",
            )
    bandwidth.set(title="Restore bandwidth (bytes / transfer time, per interval)", ylabel="GB/s")

    for name in tiers:
        reasons = sorted(
            {r for s in samples for r in (_tier(s, name) or {}).get("quarantined", {})}
        )
        for reason in reasons:
            y = [
                float(((_tier(s, name) or {}).get("quarantined") or {}).get(reason, 0.0))
                for s in samples
            ]
            quarantine.step(xs, y, where="post", label=f"{name}: quarantined ({reason})")
        for field, label in (("load_failures", "load failures"), ("loads_abandoned", "abandoned")):
            x, y = _series(samples, name, field)
            if any(y):
                quarantine.step(x, y, where="post", linestyle="--", label=f"{name}: {label}")
    quarantine.set(title="Quarantined blocks and failed loads (cumulative)", ylabel="blocks")

    for name in tiers:
        x, y = _series(samples, name, "used_bytes")
        if y:
            usage.plot(x, [v / 2**20 for v in y], label=f"{name}: used")
        x, y = _series(samples, name, "capacity_bytes")
        if y:
            usage.plot(x, [v / 2**20 for v in y], linestyle="--", label=f"{name}: cap")
    usage.set(title="Usage vs cap", ylabel="MiB")
    usage.set_yscale("symlog")

    saved.plot(xs, [float(s.get("prefill_saved_s") or 0.0) for s in samples], label="total")
    for name in tiers:
        x, y = _series(samples, name, "prefill_saved_s")
        if y:
            saved.plot(x, y, linestyle="--", label=name)
    source = next((s["prefill_source"] for s in reversed(samples) if s.get("prefill_source")), "")
    saved.set(title=f"Prefill time saved (estimate)\nrestored tokens x {source}", ylabel="s")

    for ax in axes.flat:
        ax.set_xlabel("seconds since the first sample")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left")
    fig.suptitle(f"kvtier stats: {samples[0].get('url', '')}, {len(samples)} samples")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)
