"""A run's raw JSON, and the tables and plot of every configuration run with the same workload.

Each run writes ``workload-<workload>-<label>.json`` into the output folder. The table
(``workload-<workload>.md``, and printed) and the plot (``workload-<workload>.png``: TTFT p50
per round, one line per configuration) show every run in that folder with the same workload
settings side by side, so running the driver once per server configuration, each with its own
``--label``, into one folder builds the comparison. A run with other settings in the folder is
left out, with a note.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Column, Table

from kvtier.bench.report import markdown_table
from kvtier.bench.workload.metrics import SOURCES
from kvtier.extras import require

#: The settings two runs must share to sit in one table: the workload and how it was sent.
COMPARED = ("shape", "qps", "concurrency", "endpoint", "ignore_eos")


_CHAT_FIELDS = ("users", "rounds", "system_tokens", "question_tokens", "answer_tokens", "seed")
#: The shape's fields each workload uses (the others are left out of its description).
SHAPE_FIELDS = {
    "chat": _CHAT_FIELDS,
    "no-reuse": _CHAT_FIELDS,
    "restart": _CHAT_FIELDS,
    "documents": (
        "documents",
        "document_tokens",
        "questions",
        "order",
        "question_tokens",
        "answer_tokens",
        "seed",
    ),
}


def raw_path(out: Path, workload: str, label: str) -> Path:
    return out / f"workload-{workload}-{label}.json"


def write_raw(out: Path, report: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = raw_path(out, report["config"]["shape"]["workload"], report["config"]["label"])
    path.write_text(json.dumps(report, indent=1))
    return path


def comparable(
    out: Path, report: dict[str, Any], note: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every run in ``out`` with ``report``'s workload settings (``report`` last, replacing an
    earlier run of its label)."""
    config = report["config"]
    runs = []
    for path in sorted(out.glob(f"workload-{config['shape']['workload']}-*.json")):
        try:
            other = json.loads(path.read_text())
            label = other["config"]["label"]
            same = all(other["config"].get(k) == config.get(k) for k in COMPARED)
        except (OSError, ValueError, KeyError, TypeError):
            note(f"{path.name}: not a workload run, left out")
            continue
        if label == config["label"]:
            continue
        if same:
            runs.append(other)
        else:
            note(f"{path.name}: other workload settings, left out of the table and plot")
    runs.sort(key=lambda r: r["config"].get("date", ""))
    return [*runs, report]


def _s(summary: dict[str, Any], figure: str, q: str) -> str:
    values = summary.get(figure)
    return f"{values[q]:.3f}" if values else "n/a"


def _rate(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _tokens(summary: dict[str, Any], source: str) -> str:
    value = summary["sources"]["prompt_tokens"].get(source)
    return "n/a" if value is None else f"{value:,.0f}"


def _sources(runs: list[dict[str, Any]]) -> list[str]:
    """The token sources any of ``runs`` has figures for (a server without them has none)."""
    found = {label for run in runs for label in run["summary"]["sources"]["prompt_tokens"]}
    return [label for label in SOURCES if label in found]


def header(runs: list[dict[str, Any]]) -> list[str]:
    return [
        "configuration",
        "requests (failed)",
        "TTFT p50 / p90 / p99 (s)",
        "ITL p50 (s)",
        "E2E p50 (s)",
        "requests/s",
        "output tok/s",
        *(f"{label} (tok)" for label in _sources(runs)),
    ]


def rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    sources = _sources(runs)
    out = []
    for run in runs:
        s = run["summary"]
        ttft = " / ".join(_s(s, "ttft_s", q) for q in ("p50", "p90", "p99"))
        out.append(
            [
                run["config"]["label"],
                f"{s['requests']} ({s['failed']})",
                ttft,
                _s(s, "itl_s", "p50"),
                _s(s, "e2e_s", "p50"),
                _rate(s["requests_per_s"]),
                _rate(s["output_tokens_per_s"], 1),
                *(_tokens(s, label) for label in sources),
            ]
        )
    return out


def round_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """TTFT p50 per round, a column per configuration."""
    rounds = sorted({r["round"] for run in runs for r in run["summary"]["rounds"]})
    names = ["round", *(f"{run['config']['label']} TTFT p50 (s)" for run in runs)]
    table = []
    for rnd in rounds:
        cells = [str(rnd + 1)]
        for run in runs:
            row = next((r for r in run["summary"]["rounds"] if r["round"] == rnd), None)
            cells.append(f"{row['ttft_s']['p50']:.3f}" if row and row["ttft_s"] else "n/a")
        table.append(cells)
    return names, table


#: vLLM's tier type -> the word the tables use.
_TIER_WORDS = {"primary": "host pool", "KvtierDiskTier": "disk", "KvtierSharedTier": "shared"}


def _labels(key: str) -> str:
    """``family{a=x,b=y}`` -> ``x,y`` (the counter keys of ``metrics.counters``)."""
    return key[key.index("{") + 1 : -1].split("=", 1)[-1]


def tier_lines(run: dict[str, Any]) -> list[str]:
    """What the offloading tiers did over the run, from vLLM's tiering counters and kvtier's
    own (none for a server without offloading)."""
    counters: dict[str, float] = run["summary"]["sources"]["counters"]
    hits: dict[str, list[float]] = {}
    moved: list[str] = []
    verdicts: list[str] = []
    for key, value in sorted(counters.items()):
        family, label = key.split("{", 1)[0], _labels(key)
        if family.startswith("vllm:kv_offload_tiering_chunk_"):
            word = _TIER_WORDS.get(label.split(":", 1)[-1], label)
            pair = hits.setdefault(word, [0.0, 0.0])
            pair[0 if family.endswith("_hits") else 1] += value
        elif family in ("kvtier:tier_bytes_read", "kvtier:tier_bytes_written") and value:
            what = "read" if family.endswith("_read") else "written"
            moved.append(f"{label} {what} {value / 2**20:,.1f} MiB")
        elif family == "kvtier:restore_decisions" and value:
            verdicts.append(f"{label} {value:.0f}")
    parts = [f"{w} {h:.0f} of {q:.0f} chunk lookups hit" for w, (h, q) in hits.items() if q]
    parts += moved
    if verdicts:
        parts.append("restore decisions: " + ", ".join(verdicts))
    return parts


def describe(report: dict[str, Any]) -> str:
    """One paragraph: the workload, how it was sent, the server's cache, the working set."""
    config, summary = report["config"], report["summary"]
    shape = config["shape"]
    sizes = ", ".join(f"{k}={shape[k]}" for k in SHAPE_FIELDS[shape["workload"]])
    if config.get("split_round") is not None:
        sizes += f"; the command ran before round {config['split_round'] + 1}"
    pacing = f"Poisson arrivals at {config['qps']} requests/s" if config["qps"] else "no pacing"
    cap = f"at most {config['concurrency']} in flight" if config["concurrency"] else "no cap"
    pool = summary.get("pool_tokens")
    ws = summary.get("working_set_tokens")
    cache = (
        f"; working set {ws:,} tokens = {ws / pool:.2f}x the engine's KV cache ({pool:,} tokens)"
        if pool and ws
        else ""
    )
    return (
        f"Workload {shape['workload']} ({sizes}); {pacing}, {cap}; {config['endpoint']} "
        f"endpoint, {config['url']}, model {config['model']}{cache}. {config['date']}."
    )


def markdown(runs: list[dict[str, Any]]) -> str:
    parts = [describe(runs[-1]), "", markdown_table(header(runs), rows(runs))]
    names, table = round_rows(runs)
    parts += ["", markdown_table(names, table)]
    tiers = [(run["config"]["label"], tier_lines(run)) for run in runs]
    if any(lines for _, lines in tiers):
        parts += ["", "Offloading tiers over the run:", ""]
        parts += [f"- {label}: {'; '.join(lines)}" for label, lines in tiers if lines]
    return "\n".join(parts) + "\n"


def rich_tables(runs: list[dict[str, Any]]) -> list[Table]:
    summary = Table(
        *(Column(h, justify="left" if i == 0 else "right") for i, h in enumerate(header(runs))),
        title="Workload " + runs[-1]["config"]["shape"]["workload"],
    )
    for row in rows(runs):
        summary.add_row(*row)
    names, table = round_rows(runs)
    per_round = Table(
        *(Column(h, justify="right") for h in names), title="Time to first token per round"
    )
    for row in table:
        per_round.add_row(*row)
    return [summary, per_round]


def plot(runs: list[dict[str, Any]], png: Path) -> None:
    """TTFT p50 per round, one line per configuration; a dotted line where the command ran."""
    require("bench", "the workload plot", ("matplotlib",))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for run in runs:
        rounds = [r for r in run["summary"]["rounds"] if r["ttft_s"]]
        ax.plot(
            [r["round"] + 1 for r in rounds],
            [r["ttft_s"]["p50"] for r in rounds],
            marker="o",
            label=run["config"]["label"],
        )
    shape = runs[-1]["config"]["shape"]
    split = runs[-1]["config"].get("split_round")
    if split is not None:
        ax.axvline(split + 0.5, linestyle=":", color="grey", label="command between rounds")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round" if shape["workload"] != "documents" else "times the document was asked")
    ax.set_ylabel("TTFT p50 (s)")
    ax.set_title(f"Workload {shape['workload']}: time to first token per round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)


def publish(
    out: Path, report: dict[str, Any], note: Callable[[str], None], print_tables: bool = True
) -> list[Path]:
    """Write the run's JSON, then the folder's table and plot for its workload; print the
    tables (stdout) unless told not to. Returns the files written."""
    raw = write_raw(out, report)
    runs = comparable(out, report, note)
    workload = report["config"]["shape"]["workload"]
    table = out / f"workload-{workload}.md"
    table.write_text(markdown(runs))
    png = out / f"workload-{workload}.png"
    plot(runs, png)
    if not print_tables:
        return [raw, table, png]
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a log keeps every column rather than wrapping cells
    for rich_table in rich_tables(runs):
        console.print(rich_table)
    for run in runs:
        if lines := tier_lines(run):
            console.print(f"{run['config']['label']}: {'; '.join(lines)}", markup=False)
    return [raw, table, png]
