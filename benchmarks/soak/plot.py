"""soak.png: TTFT over time per server above the fault timeline, then RSS and descriptors per
process label over time (one line per incarnation, so a restart shows as a new line).

A thousand faults drawn as vertical lines across the TTFT panel would hide the points, so the
faults get a strip of their own (a row per kind, a bar from ``t`` to ``end_t``) sharing the
time axis, and only the kill faults are also drawn as faint lines over the TTFT panel.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.soak import resources
from benchmarks.soak.events import Log

MIB = 1 << 20


def draw(log: Log, path: Path, flagged: list[dict] = ()) -> None:
    """Draw the figure into ``path``; ``flagged`` requests (over their bound with no fault to
    explain them) are marked with a black cross on the TTFT panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({str(f.get("kind")) for f in log.faults})
    cmap = plt.get_cmap("tab20")
    colour = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    fig, (ax_faults, ax_ttft, ax_rss, ax_fds) = plt.subplots(
        4,
        1,
        figsize=(13, 11),
        sharex=True,
        gridspec_kw={"height_ratios": [max(1.0, 0.25 * len(kinds)), 3, 2, 2]},
    )
    for row, kind in enumerate(kinds):
        spans = [
            (float(f["t"]), max(float(f.get("end_t") or f["t"]) - float(f["t"]), 0.5))
            for f in log.faults
            if str(f.get("kind")) == kind
        ]
        ax_faults.broken_barh(spans, (row - 0.4, 0.8), color=colour[kind])
    ax_faults.set_yticks(range(len(kinds)), kinds, fontsize=7)
    ax_faults.set_title("faults (bar: t to end_t)", fontsize=9)

    servers = sorted({str(r.get("server")) for r in log.requests})
    procs = resources.series(log)
    # One colour per label across the panels (a server's TTFT, RSS and fds alike).
    palette = plt.get_cmap("tab10")
    by_label = {k: palette(i % 10) for i, k in enumerate(sorted({*servers, *procs}))}
    for server in servers:
        pts = [
            (float(r["t"]), float(r["ttft_s"]))
            for r in log.requests
            if str(r.get("server")) == server and r.get("ttft_s") is not None
        ]
        if pts:
            ax_ttft.scatter(*zip(*pts, strict=True), s=4, label=server, color=by_label[server])
    for f in log.faults:
        if f.get("injected_kill"):
            ax_ttft.axvline(float(f["t"]), color=colour[str(f.get("kind"))], lw=0.5, alpha=0.4)
    crosses = [(float(r["t"]), float(r["ttft_s"] or r["latency_s"] or 0.0)) for r in flagged]
    if crosses:
        ax_ttft.scatter(
            *zip(*crosses, strict=True),
            marker="x",
            color="black",
            s=30,
            label="over bound, no fault",
        )
    if any(r.get("ttft_s") for r in log.requests):
        ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT s")
    ax_ttft.set_title("TTFT per server (lines: injected kills)", fontsize=9)

    for label, incarnations in sorted(procs.items()):
        line_colour = by_label[label]
        for i, pts in enumerate(incarnations):
            ts = [p["t"] for p in pts]
            ax_rss.plot(
                ts,
                [p["rss_bytes"] / MIB for p in pts],
                color=line_colour,
                lw=0.8,
                label=label if i == 0 else None,
            )
            ax_fds.plot(
                ts,
                [p["fds"] for p in pts],
                color=line_colour,
                lw=0.8,
                label=label if i == 0 else None,
            )
    ax_rss.set_ylabel("RSS MiB")
    ax_fds.set_ylabel("open fds")
    ax_fds.set_xlabel("seconds since start")
    for ax in (ax_ttft, ax_rss, ax_fds):
        if ax.get_legend_handles_labels()[0]:
            # Outside the axes, on the right: inside, it hid the first minutes' points.
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), markerscale=2)
        ax.grid(alpha=0.3)
    if log.warmup_s:
        for ax in (ax_faults, ax_ttft, ax_rss, ax_fds):
            ax.axvline(log.warmup_s, color="grey", ls="--", lw=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
