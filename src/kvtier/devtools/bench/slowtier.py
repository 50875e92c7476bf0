"""Restore or recompute on a really slow disk: TTFT with kvtier's decision off and on.

One run, side by side, on one loop-device file system (``kvtier.devtools.slowdisk``) whose
reads a cgroup v1 blkio throttle slows for the engine processes only:

1. an engine without kvtier serves one prompt per length cold: the recompute time;
2. the read limit is chosen from it: the largest length's KV bytes over ``slowdown`` times its
   cold prefill (so a restore takes about ``slowdown`` x a cold prefill there, more at the
   shorter lengths, whose prefill costs less per token);
3. for the unthrottled and then the throttled disk, one fresh kvtier engine per decision
   setting (``restore_decision=False``, then ``True``), its disk tier on the loop device and
   every process of the engine moved into the cgroup. Each first serves a few cold prompts
   (the decision learns the engine's prefill cost from its own store jobs), then a few
   warm-up restores (it learns the disk's bandwidth), then per length the measured request,
   whose prefix is only on the disk (served once, then
   ``reset_prefix_cache(reset_connector=True)`` empties the engine's cache and the host pool).
   The measured prompts are the same for every engine.

TTFT is the wall time of a ``max_tokens=1`` generate call. Reported per length: decision off,
on, min(restore, recompute) with restore = decision off and recompute = the cold prefill,
on / min; and what the decision said (``kvtier:restore_decisions`` verdicts, cached tokens).

Run: ``kvtier bench slow-tier --out slowtier-out`` (root; tiny random Llama by default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvtier
from kvtier.devtools.bench.common import FLUSH_TOKENS, BenchRun, flush_stores
from kvtier.devtools.bench.report import counter, decision_verdicts, markdown_table
from kvtier.devtools.slowdisk import SlowDisk, slow_disk, unavailable

Progress = Callable[[str], None]
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PHASES = ("unthrottled", "throttled")
DECISIONS = {"off": False, "on": True}
#: The tiny model declares 4,096 positions; its random weights do not care about more.
LONG_ENV = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
#: The loop device's image (sparse) and the disk tier's cap on it: several GiB, since the
#: tiers must each hold more than the engine's own pool (kvtier refuses a sizing trap).
DISK_SIZE, DISK_CAP = "4G", "3GiB"
#: Tokens per engine block on vLLM's CPU backend.
BLOCK_TOKENS = 128


def engine_blocks(max_len: int) -> int:
    """An engine KV pool of about two longest prompts: small, so the host pool and the disk
    tier hold more than it (or kvtier refuses to start), and enough for one request."""
    return 2 * (max_len // BLOCK_TOKENS + 1) + 8


def kv_bytes_per_token(model: str, dtype: str = "float32") -> int:
    """KV bytes one token takes (all layers, K and V) from the model's config.json."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return int(cfg["num_hidden_layers"] * 2 * heads * head_dim * DTYPE_BYTES[dtype])


def run(
    model: str,
    lengths: list[int],
    out: Path,
    slowdown: float = 3.0,
    warm_prompts: int = 3,
    warm_restores: int = 3,
    host_pool: str = "512MiB",
    progress: Progress = print,
) -> dict[str, Any]:
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"cannot make a slow disk here: {reason}")
    bench = BenchRun(out, model, max_model_len=max(lengths) + 64, max_num_seqs=1)
    per_token = kv_bytes_per_token(model)
    seeds = iter(range(7_000_000, 8_000_000))

    def prompt(n: int) -> list[int]:
        return bench.prompt(next(seeds), n)

    measured = {n: prompt(n) for n in lengths}  # the same prompts for every engine
    report: dict[str, Any] = {"kv_bytes_per_token": per_token, "load_average": [], "cold": {}}
    report["load_average"].append(os.getloadavg())

    with bench.engine("cold-no-kvtier", None, env=LONG_ENV) as engine:
        engine.generate_one(prompt(256))  # warm-up
        for n in lengths:
            result, t = engine.generate_one(measured[n])
            report["cold"][str(n)] = {"ttft_s": t, "cached": result.num_cached_tokens}
            progress(f"{n:>5} tok  cold prefill (no kvtier)   {t:8.3f} s")
    top = max(lengths)
    rate = int(per_token * top / (slowdown * report["cold"][str(top)]["ttft_s"]))
    report["read_bps"] = rate
    progress(f"read limit {rate / 1e6:.2f} MB/s ({per_token} KV bytes per token)")

    with slow_disk(out / "slowdisk", size=DISK_SIZE) as disk:
        for phase in PHASES:
            for word, decision in DECISIONS.items():
                report.setdefault(word, {})[phase] = _one_engine(
                    bench, disk, word, phase, decision, host_pool, lengths, measured, prompt,
                    rate if phase == "throttled" else None, warm_prompts, warm_restores,
                    progress,
                )  # fmt: skip
                report["load_average"].append(os.getloadavg())
    bench.config.update(
        lengths=lengths,
        slowdown=slowdown,
        warm_prompts=warm_prompts,
        warm_restores=warm_restores,
        host_pool=host_pool,
    )
    bench.write("slowtier", report, table(report, lengths))
    return report


def _one_engine(
    bench: BenchRun,
    disk: SlowDisk,
    word: str,
    phase: str,
    decision: bool,
    host_pool: str,
    lengths: list[int],
    measured: dict[int, list[int]],
    prompt: Callable[[int], list[int]],
    rate: int | None,
    warm_prompts: int,
    warm_restores: int,
    progress: Progress,
) -> dict[str, Any]:
    """One fresh kvtier engine on one disk speed: it learns prefill and this disk, then serves
    every measured prompt from the disk only."""
    config = kvtier.kv_transfer_config(
        host_pool=host_pool,
        disk_dir=disk.mount / f"tier-{word}-{phase}",
        disk_capacity=DISK_CAP,
        restore_decision=decision,
    )
    rows: dict[str, Any] = {"warm_up": []}
    disk.throttle(None)
    blocks = {"num_gpu_blocks_override": engine_blocks(max(lengths))}
    name = f"decision-{word}-{phase}"
    with bench.engine(name, config, env=LONG_ENV, extra_args=blocks) as engine:
        rows["pids_in_cgroup"] = disk.add_session(engine.pid)
        disk.throttle(rate)
        for _ in range(warm_prompts):  # prefill evidence for the decision
            engine.generate_one(prompt(max(lengths)))
        for _ in range(warm_restores):  # the decision learns this disk's bandwidth
            p = prompt(min(lengths))
            _store_on_disk_only(engine, p, prompt)
            r, t = engine.generate_one(p)
            rows["warm_up"].append({"ttft_s": t, "cached": r.num_cached_tokens})
        for n in lengths:
            p = measured[n]
            _store_on_disk_only(engine, p, prompt)
            before = engine.metrics()
            read_before = disk.bytes_read()
            r, t = engine.generate_one(p)
            after = engine.metrics()
            was = decision_verdicts(before)
            said = {k: v - was.get(k, 0.0) for k, v in decision_verdicts(after).items()}
            rows[str(n)] = {
                "ttft_s": t,
                "cached": r.num_cached_tokens,
                "verdicts": {k: v for k, v in said.items() if v},
                "abandoned": counter(after, "kvtier:tier_loads_abandoned")
                - counter(before, "kvtier:tier_loads_abandoned"),
                "device_bytes_read": disk.bytes_read() - read_before,
            }
            progress(
                f"{n:>5} tok  decision {word:<3} {phase:<11} {t:8.3f} s  "
                f"cached={r.num_cached_tokens} verdicts={rows[str(n)]['verdicts']}"
            )
        rows["metrics_end"] = {k: v for k, v in engine.metrics().items() if "kvtier:" in k}
        disk.throttle(None)  # lets every queued read finish before the engine closes
    return rows


def _store_on_disk_only(engine: Any, p: list[int], prompt: Callable[[int], list[int]]) -> None:
    """Serve ``p`` (its blocks go to the disk tier), then empty the engine's cache and the
    host pool, so the next request of ``p`` finds its prefix only on the disk.

    Without ``flush_stores`` the measured prompt was restored in part or not at all (8k: 4,096
    of 7,936 tokens, the second chunk never stored; 2k: nothing), depending on whether the
    engine happened to step again before the reset.
    """
    engine.generate_one(p)
    flush_stores(engine, prompt(FLUSH_TOKENS))
    if not engine.reset_prefix_cache(reset_connector=True):
        raise RuntimeError("reset_prefix_cache(reset_connector=True) refused")


def table(report: dict[str, Any], lengths: list[int]) -> str:
    rows = []
    for phase in PHASES:
        for n in lengths:
            cold = report["cold"][str(n)]["ttft_s"]
            off = report["off"][phase][str(n)]
            on = report["on"][phase][str(n)]
            best = min(off["ttft_s"], cold)
            rows.append(
                [
                    f"{phase}, {n} tokens",
                    f"{cold:.3f}",
                    f"{off['ttft_s']:.3f} [{off['cached']}]",
                    f"{on['ttft_s']:.3f} [{on['cached']}]",
                    f"{best:.3f}",
                    f"{on['ttft_s'] / best:.2f}",
                    f"{off['ttft_s'] / best:.2f}",
                    ", ".join(f"{k} {v:g}" for k, v in sorted(on["verdicts"].items())) or "–",
                    f"{on['abandoned']:g} / {off['abandoned']:g}",
                ]
            )
    header = [
        "disk, prompt",
        "cold prefill s",
        "decision off s [cached]",
        "decision on s [cached]",
        "min(restore, recompute) s",
        "on / min",
        "off / min",
        "on: verdicts",
        "abandoned on / off",
    ]
    loads = ", ".join(f"{a:.2f}" for a, _, _ in report["load_average"])
    return (
        markdown_table(header, rows)
        + f"\n\nRead limit of the throttled disk: {report['read_bps'] / 1e6:.2f} MB/s "
        f"({report['kv_bytes_per_token']} KV bytes per token). 1-minute load average at the "
        f"start and after each engine: {loads}."
    )
