"""N concurrent restores vs N concurrent cold prefills of the same size, N = 1, 2, 4, 8.

For each N, N fresh prompts are sent as one batch (all cold: ``num_cached_tokens == 0`` is
checked on every request), the engine cache and host pool are emptied
(``reset_prefix_cache(reset_connector=True)``), and the same N prompts are sent again as one
batch, now restored from kvtier's disk tier. Reported: the batch wall time (all first tokens out)
and the median per-request TTFT vLLM recorded, both ways, and their ratio.

Run: ``kvtier bench concurrent --out bench-out``.
"""

from collections.abc import Callable
from pathlib import Path

import kvtier
from kvtier.devtools.bench.common import BenchRun, bar_plot
from kvtier.devtools.bench.report import markdown_table, median


def run(
    model: str,
    prompt_len: int,
    counts: list[int],
    out: Path,
    host_pool: str = "4GiB",
    progress: Callable[[str], None] = print,
    in_process: bool = False,
) -> dict:
    bench = BenchRun(
        out, model, max_model_len=prompt_len + 64, max_num_seqs=max(counts), in_process=in_process
    )
    # N concurrent *restores* are measured: the decision is off so every hit is restored.
    config = kvtier.kv_transfer_config(
        host_pool=host_pool, disk_dir=out / "disk-concurrent", restore_decision=False
    )
    rows = []
    with bench.engine("kvtier", config) as engine:
        engine.generate_one(bench.prompt(2, 256))  # warm-up
        for n in counts:
            prompts = [bench.prompt(7_000_000 + n * 100 + i, prompt_len) for i in range(n)]
            cold, cold_s = engine.generate(prompts)
            if any(r.num_cached_tokens for r in cold):
                raise RuntimeError(f"N={n}: a cold prefill was a cache hit")
            # vLLM submits a step's stores at the start of the next step: one small unrelated
            # request makes sure every block of the batch is offloaded before the reset.
            engine.generate_one(bench.prompt(8_000_000 + n, 64))
            engine.reset_prefix_cache(reset_connector=True)
            restored, restore_s = engine.generate(prompts)
            if any(r.num_cached_tokens == 0 for r in restored):
                raise RuntimeError(f"N={n}: a request was not restored; the run would mislead")
            row = {
                "n": n,
                "prefill_batch_s": cold_s,
                "restore_batch_s": restore_s,
                "prefill_ttft_median_s": median([r.ttft_s or cold_s for r in cold]),
                "restore_ttft_median_s": median([r.ttft_s or restore_s for r in restored]),
                "restored_cached_tokens": [r.num_cached_tokens for r in restored],
                "prefill_tokens_per_s": n * prompt_len / cold_s,
            }
            rows.append(row)
            progress(
                f"N={n}: {n} prefills {cold_s:.2f} s, {n} restores {restore_s:.2f} s "
                f"({cold_s / restore_s:.1f}×)"
            )
    bench.config.update(prompt_len=prompt_len, counts=counts, host_pool=host_pool)
    markdown = markdown_table(
        [
            "N",
            f"N cold prefills of {prompt_len} tok (s)",
            "N disk restores (s)",
            "speed-up",
            "median TTFT prefill / restore (s)",
            "aggregate prefill tok/s",
            "restored tokens",
        ],
        [
            [
                r["n"],
                f"{r['prefill_batch_s']:.2f}",
                f"{r['restore_batch_s']:.2f}",
                f"{r['prefill_batch_s'] / r['restore_batch_s']:.1f}×",
                f"{r['prefill_ttft_median_s']:.2f} / {r['restore_ttft_median_s']:.2f}",
                f"{r['prefill_tokens_per_s']:.0f}",
                min(r["restored_cached_tokens"]),
            ]
            for r in rows
        ],
    )
    bench.write("concurrent", {"rows": rows}, markdown)
    bar_plot(
        out / "concurrent.png",
        f"N concurrent requests of {prompt_len} tokens",
        [f"N={r['n']}" for r in rows],
        {
            "cold prefills": [r["prefill_batch_s"] for r in rows],
            "disk restores": [r["restore_batch_s"] for r in rows],
        },
        "seconds",
        log=True,
    )
    return {"rows": rows}
