"""Restore or recompute on a really slow disk: TTFT with kvtier's decision off and on.

One run, side by side, on one loop-device file system (``tests.support.throttled_disk``) whose
reads a cgroup v1 blkio throttle slows for the engine processes only. One kvtier engine per
disk speed (unthrottled, then throttled) measures all three times itself, interleaved:

* ``cold``: a fresh prompt (nothing cached anywhere): the recompute time;
* ``off``: a prompt whose prefix is only on the disk, the request opting out of the decision
  (``kv_transfer_params`` ``kvtier_restore_decision: false``): the restore time;
* ``on``: the same situation, the decision taking its course.

Why one engine: engines of one configuration differ by up to 2x in prefill time on this
2-vCPU machine (0.6 s vs 1.5 s for one 8k prefill of the tiny model, each engine steady over
its own requests), so a cold prefill timed in another engine is no reference.

Each engine first serves a few cold prompts (the decision learns the engine's prefill cost
from its own store jobs), then a few opted-out restores (it learns the disk), then ``reps``
rounds; a round serves each length in each mode, in ABBA order across rounds. A prefix is put
"only on the disk" by serving the prompt, one short request (vLLM submits a step's stores at
the next step) and ``reset_prefix_cache(reset_connector=True)``; every measured request uses a
prompt of its own. The read limit makes an opted-out restore of the largest length take about
``slowdown`` x its cold prefill, from the unthrottled engine's cold prefills.

TTFT is the wall time of a ``max_tokens=1`` generate call; reported per length: medians of
cold, off, on, min(off, cold), on / min and off / min; what the decision said
(``kvtier:restore_decisions`` verdicts) and the cached tokens.

Run: ``python -m benchmarks slow-tier --out slowtier-out`` (root; tiny random Llama by default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvtier
from kvtier.bench.common import (
    FLUSH_TOKENS,
    BenchRun,
    abba_round,
    reset_all,
    serve_to_disk_only,
)
from kvtier.bench.report import counter, decision_verdicts, markdown_table, median
from kvtier.vllm.tier_decider import REQUEST_DECISION_KEY
from tests.support.throttled_disk import SlowDisk, slow_disk, unavailable

Progress = Callable[[str], None]
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PHASES = ("unthrottled", "throttled")
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
    reps: int = 3,
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

    report: dict[str, Any] = {"kv_bytes_per_token": per_token, "load_average": [os.getloadavg()]}
    top = max(lengths)
    with slow_disk(out / "slowdisk", size=DISK_SIZE) as disk:
        rate: int | None = None
        for phase in PHASES:
            if phase == "throttled":
                cold_top = median(report["unthrottled"][str(top)]["cold"]["ttft_s"])
                rate = int(per_token * top / (slowdown * cold_top))
                report["read_bps"] = rate
                progress(f"read limit {rate / 1e6:.2f} MB/s ({per_token} KV bytes per token)")
            report[phase] = _one_engine(
                bench, disk, phase, host_pool, lengths, prompt, rate, reps, warm_prompts,
                warm_restores, progress,
            )  # fmt: skip
            report["load_average"].append(os.getloadavg())
    bench.config.update(
        lengths=lengths,
        slowdown=slowdown,
        reps=reps,
        warm_prompts=warm_prompts,
        warm_restores=warm_restores,
        host_pool=host_pool,
    )
    bench.write("slowtier", report, table(report, lengths))
    return report


def _one_engine(
    bench: BenchRun,
    disk: SlowDisk,
    phase: str,
    host_pool: str,
    lengths: list[int],
    prompt: Callable[[int], list[int]],
    rate: int | None,
    reps: int,
    warm_prompts: int,
    warm_restores: int,
    progress: Progress,
) -> dict[str, Any]:
    """One fresh kvtier engine (decision on) on one disk speed: it learns prefill and this
    disk, then times cold, opted-out and decided requests, interleaved."""
    config = kvtier.kv_transfer_config(
        host_pool=host_pool,
        disk_dir=disk.mount / f"tier-{phase}",
        disk_capacity=DISK_CAP,
        restore_decision=True,
    )
    rows: dict[str, Any] = {"warm_up": []}
    disk.throttle(None)
    blocks = {"num_gpu_blocks_override": engine_blocks(max(lengths))}
    with bench.engine(f"slowtier-{phase}", config, env=LONG_ENV, extra_args=blocks) as engine:
        rows["pids_in_cgroup"] = disk.add_session(engine.pid)
        disk.throttle(rate)
        for _ in range(warm_prompts):  # prefill evidence for the decision
            engine.generate_one(prompt(max(lengths)))
        for _ in range(warm_restores):  # the decision learns this disk's bandwidth
            p = prompt(min(lengths))
            serve_to_disk_only(engine, [p], prompt(FLUSH_TOKENS))
            r, t = engine.generate_one(p, kv_transfer_params=MODES["off"])
            rows["warm_up"].append({"ttft_s": t, "cached": r.num_cached_tokens})
        for rep in range(reps):
            order = abba_round(MODE_ORDER, rep)
            for n in lengths:
                for mode in order:
                    one = _measure(engine, disk, mode, prompt(n), prompt)
                    cell = rows.setdefault(str(n), {}).setdefault(mode, {})
                    for k, v in one.items():
                        cell.setdefault(k, []).append(v)
                    progress(
                        f"{n:>5} tok  {phase:<11} {mode:<4} {one['ttft_s']:8.3f} s  "
                        f"cached={one['cached']} verdicts={one['verdicts']}"
                    )
        rows["metrics_end"] = {k: v for k, v in engine.metrics().items() if "kvtier:" in k}
        disk.throttle(None)  # lets every queued read finish before the engine closes
    return rows


#: The measured modes and the ``kv_transfer_params`` each request carries (see module doc).
MODES: dict[str, dict[str, Any] | None] = {
    "cold": None,
    "off": {REQUEST_DECISION_KEY: False},
    "on": None,
}
MODE_ORDER = tuple(MODES)


def _measure(
    engine: Any, disk: SlowDisk, mode: str, p: list[int], prompt: Callable[[int], list[int]]
) -> dict[str, Any]:
    """One measured request of ``mode`` (its prefix on the disk only, unless ``cold``)."""
    if mode == "cold":
        reset_all(engine)
    else:
        serve_to_disk_only(engine, [p], prompt(FLUSH_TOKENS))
    before = engine.metrics()
    read_before = disk.bytes_read()
    r, t = engine.generate_one(p, kv_transfer_params=MODES[mode])
    after = engine.metrics()
    was = decision_verdicts(before)
    said = {k: v - was.get(k, 0.0) for k, v in decision_verdicts(after).items()}
    abandoned = "kvtier:tier_loads_abandoned"
    return {
        "ttft_s": t,
        "cached": r.num_cached_tokens,
        "verdicts": {k: v for k, v in said.items() if v},
        "abandoned": counter(after, abandoned) - counter(before, abandoned),
        "device_bytes_read": disk.bytes_read() - read_before,
    }


def table(report: dict[str, Any], lengths: list[int]) -> str:
    rows = []
    for phase in PHASES:
        for n in lengths:
            cell = report[phase][str(n)]
            cold, off, on = (median(cell[m]["ttft_s"]) for m in MODE_ORDER)
            best = min(off, cold)
            verdicts: dict[str, float] = {}
            for said in cell["on"]["verdicts"]:
                for k, v in said.items():
                    verdicts[k] = verdicts.get(k, 0.0) + v
            rows.append(
                [
                    f"{phase}, {n} tokens",
                    f"{cold:.3f}",
                    f"{off:.3f} [{_cached(cell['off'])}]",
                    f"{on:.3f} [{_cached(cell['on'])}]",
                    f"{best:.3f}",
                    f"{on / best:.2f}",
                    f"{off / best:.2f}",
                    ", ".join(f"{k} {v:g}" for k, v in sorted(verdicts.items())) or "–",
                    f"{sum(cell['on']['abandoned']):g} / {sum(cell['off']['abandoned']):g}",
                ]
            )
    header = [
        "disk, prompt",
        "cold prefill s",
        "decision off s [cached]",
        "decision on s [cached]",
        "min(off, cold) s",
        "on / min",
        "off / min",
        "on: verdicts",
        "abandoned on / off",
    ]
    loads = ", ".join(f"{a:.2f}" for a, _, _ in report["load_average"])
    reps = len(report[PHASES[0]][str(lengths[0])]["cold"]["ttft_s"])
    return (
        markdown_table(header, rows)
        + f"\n\nMedians of {reps} requests per cell, all three columns of a row timed in one "
        f"engine, interleaved. Read limit of the throttled disk: "
        f"{report['read_bps'] / 1e6:.2f} MB/s ({report['kv_bytes_per_token']} KV bytes per "
        f"token). 1-minute load average at the start and after each engine: {loads}."
    )


def _cached(cell: dict[str, list[Any]]) -> str:
    """The cached tokens of a cell's requests: one number when they all agree."""
    seen = sorted(set(cell["cached"]))
    return str(seen[0]) if len(seen) == 1 else "/".join(map(str, cell["cached"]))
