"""Time to first token: cold prefill vs host-pool restore vs disk restore, kvtier vs stock fs.

One run, three engines, one set of cold prefills:

1. engine W writes: both disk tiers configured (kvtier's and vLLM's stock ``fs``, write-through
   to both). Per prompt: cold (``num_cached_tokens == 0`` checked), engine prefix-cache hit,
   host-pool restore (after ``reset_prefix_cache()``).
2. page cache dropped (root only), fresh engine with only kvtier's disk tier: per prompt, disk
   restore in a fresh process (cold disk), then ``reset_prefix_cache(reset_connector=True)``
   and disk restore again (page cache warm).
3. the same with only the stock ``fs`` tier.

TTFT is the wall time of a ``max_tokens=1`` generate call. Each cell is the median over
``reps`` distinct prompts of that length with min–max.

Run: ``kvtier bench ttft --out bench-out`` (about 15 minutes on 2 cores at 2k/4k/8k).
"""

from collections.abc import Callable
from pathlib import Path

import kvtier
from kvtier.devtools.bench.common import BenchRun, bar_plot
from kvtier.devtools.bench.report import (
    drop_page_cache,
    markdown_table,
    median,
    median_range,
    summarize,
)

KINDS = {
    "cold": "cold prefill",
    "engine_hit": "engine prefix-cache hit",
    "host_restore": "host-pool restore",
    "kvtier_fresh": "kvtier disk, fresh process (cold disk)",
    "kvtier_warm": "kvtier disk, in process (second read)",
    "fs_fresh": "stock fs disk, fresh process (cold disk)",
    "fs_warm": "stock fs disk, in process (second read)",
}

Progress = Callable[[str], None]


def run(
    model: str,
    lengths: list[int],
    reps: int,
    out: Path,
    host_pool: str = "4GiB",
    progress: Progress = print,
    in_process: bool = False,
    restore_decision: bool = True,
) -> dict:
    bench = BenchRun(
        out, model, max_model_len=max(lengths) + 64, max_num_seqs=1, in_process=in_process
    )
    kv_dir, fs_dir = out / "disk-kvtier", out / "disk-fs"
    both = kvtier.kv_transfer_config(
        host_pool=host_pool, disk_dir=kv_dir, restore_decision=restore_decision
    )
    both["kv_connector_extra_config"]["secondary_tiers"] += kvtier.kv_transfer_config(
        disk_dir=fs_dir, disk_tier="fs"
    )["kv_connector_extra_config"]["secondary_tiers"]
    samples: dict[str, dict[str, list[dict]]] = {str(n): {k: [] for k in KINDS} for n in lengths}
    prompts = {(n, r): bench.prompt(n * 1000 + r, n) for n in lengths for r in range(reps)}

    def record(n: int, kind: str, result, elapsed: float) -> None:
        samples[str(n)][kind].append({"ttft_s": elapsed, "cached": result.num_cached_tokens})
        progress(
            f"{n:>5} tok  {KINDS[kind]:<44} {elapsed:8.3f} s  cached={result.num_cached_tokens}"
        )

    with bench.engine("writer-both-tiers", both) as engine:
        engine.generate_one(bench.prompt(1, 256))  # warm-up
        for (n, _), prompt in prompts.items():
            cold, t = engine.generate_one(prompt)
            if cold.num_cached_tokens:
                raise RuntimeError(f"cold run of {n} tokens was a cache hit")
            record(n, "cold", cold, t)
            record(n, "engine_hit", *engine.generate_one(prompt))
            engine.reset_prefix_cache()
            record(n, "host_restore", *engine.generate_one(prompt))
    dropped = []
    for tier, disk_dir, fresh, warm in (
        ("kvtier", kv_dir, "kvtier_fresh", "kvtier_warm"),
        ("fs", fs_dir, "fs_fresh", "fs_warm"),
    ):
        dropped.append(drop_page_cache())
        config = kvtier.kv_transfer_config(
            host_pool=host_pool,
            disk_dir=disk_dir,
            disk_tier=tier,
            restore_decision=restore_decision,
        )
        with bench.engine(f"reader-{tier}", config) as engine:
            for (n, _), prompt in prompts.items():
                record(n, fresh, *engine.generate_one(prompt))
                engine.reset_prefix_cache(reset_connector=True)
                record(n, warm, *engine.generate_one(prompt))
    bench.config.update(
        lengths=lengths,
        reps=reps,
        host_pool=host_pool,
        restore_decision=restore_decision,
        page_cache_dropped_before_fresh_processes=all(dropped),
    )
    summary = {
        n: {kind: summarize([s["ttft_s"] for s in runs]).as_dict() for kind, runs in kinds.items()}
        for n, kinds in samples.items()
    }
    report = {"samples": samples, "summary_ttft_s": summary}
    markdown = table(samples, lengths)
    bench.write("ttft", report, markdown)
    plot(samples, lengths, out / "ttft.png")
    return report


def medians(samples: dict, lengths: list[int], kind: str) -> list[float]:
    return [median([s["ttft_s"] for s in samples[str(n)][kind]]) for n in lengths]


def table(samples: dict, lengths: list[int]) -> str:
    rows = []
    for kind, label in KINDS.items():
        cells = []
        for n in lengths:
            runs = samples[str(n)][kind]
            cached = "/".join(str(c) for c in sorted({s["cached"] for s in runs}))
            cells.append(f"{median_range([s['ttft_s'] for s in runs])} [{cached}]")
        rows.append([label, *cells])
    cold = medians(samples, lengths, "cold")
    for kind in ("host_restore", "kvtier_fresh", "fs_fresh"):
        ratios = [c / r for c, r in zip(cold, medians(samples, lengths, kind), strict=True)]
        rows.append([f"cold / {KINDS[kind]}", *(f"{x:.1f}×" for x in ratios)])
    fs_vs = [
        f / k
        for f, k in zip(
            medians(samples, lengths, "fs_fresh"),
            medians(samples, lengths, "kvtier_fresh"),
            strict=True,
        )
    ]
    rows.append(["stock fs / kvtier (fresh process)", *(f"{x:.2f}" for x in fs_vs)])
    header = ["TTFT s, median (min–max) [cached tokens]", *(f"{n} tokens" for n in lengths)]
    return markdown_table(header, rows)


def plot(samples: dict, lengths: list[int], path: Path) -> None:
    bar_plot(
        path,
        "Time to first token, SmolLM2-135M fp32, 2 CPU cores (log scale)",
        [f"{n} tok" for n in lengths],
        {KINDS[k]: medians(samples, lengths, k) for k in KINDS},
        "seconds",
        log=True,
    )
