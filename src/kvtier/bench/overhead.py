"""Connector overhead with zero reuse: the same request set with kvtier on and off.

Every prompt is new (random tokens, no shared prefix), so kvtier only stores and never restores:
what is measured is the cost of having it on. Both engines run with
``VLLM_CPU_NUM_OF_RESERVED_CPU=0``: vLLM reserves a core for itself without a KV connector and
none with one on a 2-core machine, so the default would compare 1 core with 2.

Each pass sends ``requests`` prompts as one batch (``max_num_seqs`` at a time); per request vLLM
records TTFT (arrival to first token, queueing included) and decode time. The engines alternate
off, on, off, on... for ``passes`` passes each, with fresh prompts every pass.

Run: ``kvtier bench overhead --out bench-out``.
"""

from collections.abc import Callable
from pathlib import Path

import kvtier
from kvtier.bench.common import BenchRun, random_prompt
from kvtier.bench.report import markdown_table
from kvtier.bench.stats import median


def run(
    model: str,
    out: Path,
    requests: int = 16,
    prompt_len: int = 512,
    output_len: int = 32,
    passes: int = 3,
    progress: Callable[[str], None] = print,
    in_process: bool = False,
) -> dict:
    bench = BenchRun(
        out,
        model,
        max_model_len=prompt_len + output_len + 64,
        max_num_seqs=8,
        in_process=in_process,
    )
    configs = {
        "off": None,
        "on": kvtier.kv_transfer_config(host_pool="2GiB", disk_dir=out / "disk-overhead"),
    }
    results: dict[str, list[dict]] = {"off": [], "on": []}
    engines = {name: bench.engine(f"overhead-{name}", cfg) for name, cfg in configs.items()}
    try:
        for engine in engines.values():
            engine.generate_one(random_prompt(128, 3, vocab=bench.vocab), max_tokens=4)  # warm-up
        seed = 9_000_000
        for p in range(passes):
            for name, engine in engines.items():
                prompts = [
                    random_prompt(prompt_len, seed + i, vocab=bench.vocab) for i in range(requests)
                ]
                seed += requests
                batch, wall = engine.generate(prompts, max_tokens=output_len)
                ttft = [r.ttft_s for r in batch if r.ttft_s is not None]
                tpot = [
                    r.decode_s / (r.output_tokens - 1)
                    for r in batch
                    if r.decode_s is not None and (r.output_tokens or 0) > 1
                ]
                results[name].append(
                    {
                        "wall_s": wall,
                        "ttft_median_s": median(ttft),
                        "tpot_median_s": median(tpot),
                        "throughput_tok_s": requests * (prompt_len + output_len) / wall,
                        "cached": [r.num_cached_tokens for r in batch],
                    }
                )
                progress(
                    f"pass {p + 1} kvtier {name}: wall {wall:.2f} s, TTFT median "
                    f"{median(ttft):.3f} s, TPOT median {median(tpot) * 1000:.1f} ms"
                )
    finally:
        for engine in engines.values():
            engine.close()
    if any(any(r["cached"]) for runs in results.values() for r in runs):
        raise RuntimeError("a request hit a cache: the overhead run must have zero reuse")

    def med(name: str, key: str) -> float:
        return median([r[key] for r in results[name]])

    rows = []
    for key, label, scale in (
        ("ttft_median_s", "median TTFT (ms)", 1000),
        ("tpot_median_s", "median time per output token (ms)", 1000),
        ("throughput_tok_s", "throughput (tokens/s)", 1),
    ):
        off, on = med("off", key), med("on", key)
        rows.append(
            [label, f"{off * scale:.1f}", f"{on * scale:.1f}", f"{(on - off) / off * 100:+.1f} %"]
        )
    bench.config.update(
        requests=requests, prompt_len=prompt_len, output_len=output_len, passes=passes
    )
    markdown = markdown_table(
        ["metric (median of passes)", "kvtier off", "kvtier on", "change"], rows
    )
    bench.write("overhead", {"passes": results}, markdown)
    return {"passes": results}
