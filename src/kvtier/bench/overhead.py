"""Connector overhead with zero reuse: the same request set with kvtier on and off.

Every prompt is new (random tokens, no shared prefix), so kvtier only stores and never restores:
what is measured is the cost of having it on. Both engines run with
``VLLM_CPU_NUM_OF_RESERVED_CPU=0``: vLLM reserves a core for itself without a KV connector and
none with one on a 2-core machine, so the default would compare 1 core with 2.

Each pass has two phases, on fresh prompts:

* latency: ``latency_requests`` requests one at a time; per request vLLM records TTFT (arrival
  to first token) and time per output token. One at a time because in a saturated batch TTFT
  is mostly queueing, which varied by ±20 % between identical passes here and would hide a
  1 % effect;
* throughput: ``requests`` requests as one batch (``max_num_seqs`` at a time); prompt plus
  output tokens per second of wall time.

The two engines (both alive for the whole run, one busy at a time) alternate off, on, off,
on... for ``passes`` passes each; the table shows the median over passes of each pass's
median, and the spread of the per-pass figures.

Wall-clock figures on two shared cores vary by several percent from pass to pass, more than
the effect measured. So the run also reports the CPU time kvtier's own threads (copies, disk
I/O, checksums; named ``kvtier-...`` for the kernel) used, as a share of all CPU time the
engine's processes used: a direct measure of what kvtier takes from the engine.

``compare_decision``: a third engine, kvtier on with the restore decision off, joins the
rotation (off, on, on without decision, ...), so the decision's own cost with zero reuse (it
only measures prefill then: nothing to decide) is side by side too.

``run_stores_same_engine`` (``--same-engine``): the store path's cost alone, in one engine,
requests that store against requests that store nothing.

Run: ``kvtier bench overhead --out bench-out`` (``--same-engine``).
"""

from collections.abc import Callable
from pathlib import Path

import kvtier
from kvtier.bench.common import BenchRun, abba_round
from kvtier.bench.harness import Engine, GenerateResult
from kvtier.bench.harness.cpu import session_cpu
from kvtier.bench.report import counter, markdown_table, median, median_range

#: The third engine's name with ``compare_decision``.
NO_DECISION = "on, decision off"


def _tpot(result: GenerateResult) -> float | None:
    if result.decode_s is None or (result.output_tokens or 0) < 2:
        return None
    return result.decode_s / (result.output_tokens - 1)  # type: ignore[operator]


def _one_pass(
    engine: Engine,
    prompts: list[list[int]],
    batch: list[list[int]],
    output_len: int,
    prompt_len: int,
) -> dict:
    singles = [engine.generate_one(p, max_tokens=output_len)[0] for p in prompts]
    batched, wall = engine.generate(batch, max_tokens=output_len)
    ttft = [r.ttft_s for r in singles if r.ttft_s is not None]
    tpot = [t for r in singles if (t := _tpot(r)) is not None]
    if len(ttft) != len(singles) or len(tpot) != len(singles):
        raise RuntimeError("vLLM did not record TTFT / decode time for every request")
    return {
        "ttft_median_s": median(ttft),
        "tpot_median_s": median(tpot),
        "throughput_tok_s": len(batch) * (prompt_len + output_len) / wall,
        "batch_wall_s": wall,
        "cached": [r.num_cached_tokens for r in singles + batched],
    }


def run(
    model: str,
    out: Path,
    requests: int = 16,
    prompt_len: int = 512,
    output_len: int = 32,
    passes: int = 3,
    latency_requests: int = 6,
    progress: Callable[[str], None] = print,
    in_process: bool = False,
    compare_decision: bool = False,
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
    if compare_decision:
        configs[NO_DECISION] = kvtier.kv_transfer_config(
            host_pool="2GiB", disk_dir=out / "disk-overhead-no-decision", restore_decision=False
        )
    results: dict[str, list[dict]] = {name: [] for name in configs}
    engines = {name: bench.engine(f"overhead-{name}", cfg) for name, cfg in configs.items()}
    try:
        for engine in engines.values():
            engine.generate_one(bench.prompt(3, 128), max_tokens=4)  # warm-up
        seed = 9_000_000
        for p in range(passes):
            for name, engine in engines.items():
                prompts = [
                    bench.prompt(seed + i, prompt_len) for i in range(latency_requests + requests)
                ]
                seed += len(prompts)
                figures = _one_pass(
                    engine,
                    prompts[:latency_requests],
                    prompts[latency_requests:],
                    output_len,
                    prompt_len,
                )
                results[name].append(figures)
                progress(
                    f"pass {p + 1} kvtier {name}: TTFT median {figures['ttft_median_s']:.3f} s, "
                    f"TPOT median {figures['tpot_median_s'] * 1000:.1f} ms, throughput "
                    f"{figures['throughput_tok_s']:.1f} tok/s"
                )
        cpu = {name: session_cpu(engine.pid) for name, engine in engines.items()}
    finally:
        for engine in engines.values():
            engine.close()
    if any(any(r["cached"]) for runs in results.values() for r in runs):
        raise RuntimeError("a request hit a cache: the overhead run must have zero reuse")

    def figure(name: str, key: str, scale: float) -> str:
        return median_range([r[key] * scale for r in results[name]], digits=1)

    rows = []
    for key, label, scale in (
        ("ttft_median_s", "TTFT, one request at a time (ms)", 1000),
        ("tpot_median_s", "time per output token, one at a time (ms)", 1000),
        ("throughput_tok_s", f"throughput, {requests} requests at once (tokens/s)", 1),
    ):
        off = median([r[key] for r in results["off"]])
        on = median([r[key] for r in results["on"]])
        change = f"{(on - off) / off:+.1%}"
        row = [label, figure("off", key, scale), figure("on", key, scale), change]
        if compare_decision:
            without = median([r[key] for r in results[NO_DECISION]])
            row += [figure(NO_DECISION, key, scale), f"{(on - without) / without:+.1%}"]
        rows.append(row)
    cpu_row = ["CPU time of kvtier's own threads, whole run (share of the engine's CPU time)", "–"]
    for name in ("on", NO_DECISION) if compare_decision else ("on",):
        split = cpu[name]
        cpu_row += [f"{split.kvtier_s:.1f} s of {split.total_s:.0f} s", f"{split.kvtier_share:.2%}"]
    rows.append(cpu_row)
    bench.config.update(
        requests=requests,
        latency_requests=latency_requests,
        prompt_len=prompt_len,
        output_len=output_len,
        passes=passes,
    )
    header = ["metric: median of per-pass figures (min–max)", "kvtier off", "kvtier on", "change"]
    if compare_decision:
        header += ["kvtier on, decision off", "decision on vs off"]
    markdown = markdown_table(header, rows)
    cpu_json = {name: vars(split) for name, split in cpu.items()}
    bench.write("overhead", {"passes": results, "cpu_s": cpu_json}, markdown)
    return {"passes": results, "cpu_s": cpu_json}


#: vLLM's per-request cap on offloaded tokens (``kv_transfer_params``): 0 stores nothing.
NO_STORES = {"max_offload_tokens": 0}


def run_stores_same_engine(
    model: str,
    out: Path,
    pairs: int = 12,
    prompt_len: int = 512,
    output_len: int = 32,
    disk_dir: Path | None = None,
    progress: Callable[[str], None] = print,
    in_process: bool = False,
) -> dict:
    """What storing costs, in one kvtier engine: zero-reuse requests whose blocks kvtier
    stores, alternated (ABBA) with requests that store nothing (vLLM's per-request
    ``max_offload_tokens: 0``), one at a time. Engine-to-engine spread, which swamps an
    engine-per-setting comparison on this machine, cancels out; what is left is the cost of
    kvtier's store path (host-pool copies, disk writes). ``disk_dir``: where the disk tier
    lives (default under ``out``; a tmpfs folder separates write I/O from the rest).
    Writes ``overhead-stores.json`` / ``.md``."""
    bench = BenchRun(
        out, model, max_model_len=prompt_len + output_len + 64, max_num_seqs=8,
        in_process=in_process,
    )  # fmt: skip
    folder = disk_dir if disk_dir is not None else out / "disk-overhead-stores"
    config = kvtier.kv_transfer_config(host_pool="2GiB", disk_dir=folder)
    modes: dict[str, dict | None] = {"stores": None, "no stores": NO_STORES}
    singles: dict[str, list[GenerateResult]] = {m: [] for m in modes}
    seeds = iter(range(11_000_000, 12_000_000))
    with bench.engine("overhead-stores", config) as engine:
        engine.generate_one(bench.prompt(3, 128), max_tokens=4)  # warm-up
        written_before = engine.metrics()
        for i in range(pairs):
            for mode in abba_round(tuple(modes), i):
                prompt = bench.prompt(next(seeds), prompt_len)
                result, _ = engine.generate_one(
                    prompt, max_tokens=output_len, kv_transfer_params=modes[mode]
                )
                singles[mode].append(result)
            progress(f"pair {i + 1}/{pairs}")
        written = counter(engine.metrics(), "kvtier:tier_bytes_written") - counter(
            written_before, "kvtier:tier_bytes_written"
        )
    if any(r.num_cached_tokens for rs in singles.values() for r in rs):
        raise RuntimeError("a request hit a cache: the overhead run must have zero reuse")
    figures = {
        m: {
            "ttft_s": [r.ttft_s for r in rs],
            "tpot_s": [_tpot(r) for r in rs],
        }
        for m, rs in singles.items()
    }
    rows = []
    for key, label in (("ttft_s", "TTFT (ms)"), ("tpot_s", "time per output token (ms)")):
        stores, none = (median(figures[m][key]) for m in modes)
        rows.append([label, f"{none * 1000:.1f}", f"{stores * 1000:.1f}", f"{stores / none:.3f}"])
    markdown = markdown_table(
        ["one request at a time, median", "no stores", "stores", "stores / no stores"], rows
    )
    markdown += (
        f"\n\n{pairs} requests per column, ABBA, one engine; {prompt_len}-token prompts, "
        f"{output_len} output tokens; disk tier in {folder}; {written / 1e6:.0f} MB written."
    )
    bench.config.update(
        pairs=pairs, prompt_len=prompt_len, output_len=output_len, disk_dir=str(folder)
    )
    report = {"figures": figures, "bytes_written": written}
    bench.write("overhead-stores", report, markdown)
    return report
