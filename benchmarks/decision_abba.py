"""The restore decision's cost on disk restores: reader engines on, off, off, on, on, off.

``kvtier bench ttft --compare-decision`` runs one reader engine per setting, so an
engine-to-engine difference (measured at up to ±15 % between two engines of the same setting
here) reads as the decision's cost. This bench spreads each setting over several engines in
ABBA order on one folder:

1. a writer engine (kvtier disk tier) serves ``reps`` prompts per length cold and is closed;
2. ``2 * engines_per_setting`` reader engines, settings alternating on, off, off, on, ...;
   each first prefills ``WARMUP_PROMPTS`` unrelated prompts cold (so its prefill is measured
   and the decision is really taken), then per prompt: a disk restore in the fresh process,
   ``reset_prefix_cache(reset_connector=True)``, and a second disk restore.

Reported per length and kind: the median over every engine of the setting, the per-engine
medians (their spread is the noise floor), on / off, and the verdicts each engine's tier gave.

``run_same_engine`` (``--same-engine``): both settings in one engine instead, through the
per-request opt-out, single requests and concurrent batches.

Run: ``python -m benchmarks decision --out bench-out`` (``--same-engine``).
"""

from collections.abc import Callable
from pathlib import Path

import kvtier
from kvtier.bench.common import FLUSH_TOKENS, BenchRun, abba_round, serve_to_disk_only
from kvtier.bench.report import decision_verdicts, drop_page_cache, markdown_table, median
from kvtier.bench.ttft import WARMUP_PROMPTS, WARMUP_TOKENS
from kvtier.vllm.tier_decider import REQUEST_DECISION_KEY

KINDS = ("fresh", "warm")


def abba(engines_per_setting: int) -> list[bool]:
    """On, off, off, on, on, off, ...: each setting as often first as second."""
    order: list[bool] = []
    for i in range(engines_per_setting):
        order += [True, False] if i % 2 == 0 else [False, True]
    return order


def run(
    model: str,
    lengths: list[int],
    reps: int,
    out: Path,
    engines_per_setting: int = 3,
    host_pool: str = "4GiB",
    progress: Callable[[str], None] = print,
    in_process: bool = False,
) -> dict:
    """Write ``decision.json`` and ``decision.md`` under ``out``."""
    bench = BenchRun(
        out, model, max_model_len=max(lengths) + 64, max_num_seqs=1, in_process=in_process
    )
    folder = out / "disk-decision"
    prompts = {(n, r): bench.prompt(n * 1000 + r, n) for n in lengths for r in range(reps)}
    writer = kvtier.kv_transfer_config(host_pool=host_pool, disk_dir=folder)
    with bench.engine("writer", writer) as engine:
        engine.generate_one(bench.prompt(1, 256))
        for (n, _), prompt in prompts.items():
            if engine.generate_one(prompt)[0].num_cached_tokens:
                raise RuntimeError(f"the cold run of {n} tokens was a cache hit")
    # per engine: {"setting": bool, "samples": {f"{n}/{kind}": [s, ...]}, "verdicts": {...}}
    engines: list[dict] = []
    for i, decision in enumerate(abba(engines_per_setting)):
        drop_page_cache()
        setting = "on" if decision else "off"
        config = kvtier.kv_transfer_config(
            host_pool=host_pool, disk_dir=folder, restore_decision=decision
        )
        samples: dict[str, list[float]] = {}
        with bench.engine(f"reader-{i}-{setting}", config) as engine:
            for w in range(WARMUP_PROMPTS):
                warm_up = bench.prompt(10**6 + 100 * i + w, min(WARMUP_TOKENS, max(lengths)))
                engine.generate_one(warm_up)
            for (n, _), prompt in prompts.items():
                for kind in KINDS:
                    result, seconds = engine.generate_one(prompt)
                    if result.num_cached_tokens < n // 128 * 128 - 128:
                        raise RuntimeError(f"reader {i}: {n} tokens restored only in part")
                    samples.setdefault(f"{n}/{kind}", []).append(seconds)
                    engine.reset_prefix_cache(reset_connector=True)
            verdicts = decision_verdicts(engine.metrics())
        engines.append({"setting": setting, "samples": samples, "verdicts": verdicts})
        progress(f"reader {i} ({setting}): {verdicts}")
    rows = []
    for n in lengths:
        for kind in KINDS:
            cell = f"{n}/{kind}"
            per_engine = {
                s: [median(e["samples"][cell]) for e in engines if e["setting"] == s]
                for s in ("on", "off")
            }
            pooled = {
                s: median([x for e in engines if e["setting"] == s for x in e["samples"][cell]])
                for s in ("on", "off")
            }
            rows.append(
                [
                    f"{n} tokens, {'fresh process' if kind == 'fresh' else 'second read'}",
                    f"{pooled['on']:.3f}",
                    f"{pooled['off']:.3f}",
                    f"{pooled['on'] / pooled['off']:.2f}",
                    " / ".join(f"{x:.3f}" for x in per_engine["on"]),
                    " / ".join(f"{x:.3f}" for x in per_engine["off"]),
                ]
            )
    markdown = markdown_table(
        [
            "disk restore TTFT s",
            "decision on, median",
            "decision off, median",
            "on / off",
            "per engine, on",
            "per engine, off",
        ],
        rows,
    )
    markdown += "\n\nverdicts per reader: " + "; ".join(
        f"{i} {e['setting']}: {e['verdicts']}" for i, e in enumerate(engines)
    )
    bench.config.update(
        lengths=lengths, reps=reps, engines_per_setting=engines_per_setting, host_pool=host_pool
    )
    report = {"engines": engines}
    bench.write("decision", report, markdown)
    return report


#: A request's ``kv_transfer_params`` per setting in ``run_same_engine`` (on: the default).
SAME_ENGINE_PARAMS: dict[str, dict | None] = {"on": None, "off": {REQUEST_DECISION_KEY: False}}


def run_same_engine(
    model: str,
    lengths: list[int],
    reps: int,
    out: Path,
    batch: int = 4,
    host_pool: str = "4GiB",
    progress: Callable[[str], None] = print,
    in_process: bool = False,
) -> dict:
    """Both settings in one engine (decision on; "off" requests opt out per request), ABBA.

    Engines of one configuration differ by up to 2x in prefill time here, which an
    engine-per-setting comparison cannot tell from the decision's cost. One kvtier engine
    (disk tier, decision on) prefills ``WARMUP_PROMPTS`` prompts cold, then per length and
    round: a disk-only restore of one prompt (served, flushed, ``reset_prefix_cache``) and a
    batch of ``batch`` concurrent disk-only restores, for "on" and "off" in ABBA order
    across rounds, every measured request on a prompt of its own. Writes
    ``decision-same-engine.json`` / ``.md``.
    """
    bench = BenchRun(
        out, model, max_model_len=max(lengths) + 64, max_num_seqs=batch, in_process=in_process
    )
    seeds = iter(range(20_000_000, 21_000_000))
    config = kvtier.kv_transfer_config(host_pool=host_pool, disk_dir=out / "disk-same-engine")
    samples: dict[str, list[float]] = {}
    cached: dict[str, list[int]] = {}
    with bench.engine("decision-same-engine", config) as engine:
        for _ in range(WARMUP_PROMPTS):
            engine.generate_one(bench.prompt(next(seeds), min(WARMUP_TOKENS, max(lengths))))
        for rep in range(reps):
            order = abba_round(tuple(SAME_ENGINE_PARAMS), rep)
            for n in lengths:
                for kind, count in (("single", 1), (f"batch of {batch}", batch)):
                    for setting in order:
                        prompts = [bench.prompt(next(seeds), n) for _ in range(count)]
                        serve_to_disk_only(engine, prompts, bench.prompt(next(seeds), FLUSH_TOKENS))
                        results, seconds = engine.generate(
                            prompts, kv_transfer_params=SAME_ENGINE_PARAMS[setting]
                        )
                        cell = f"{n}/{kind}/{setting}"
                        samples.setdefault(cell, []).append(seconds)
                        cached.setdefault(cell, []).extend(r.num_cached_tokens for r in results)
                        progress(f"{n:>5} tok  {kind:<10} {setting:<3} {seconds:7.3f} s")
        verdicts = decision_verdicts(engine.metrics())
    rows = []
    for n in lengths:
        for kind in ("single", f"batch of {batch}"):
            on, off = (median(samples[f"{n}/{kind}/{s}"]) for s in ("on", "off"))
            rows.append(
                [
                    f"{n} tokens, {kind}",
                    f"{on:.3f}",
                    f"{off:.3f}",
                    f"{on / off:.2f}",
                    f"{min(cached[f'{n}/{kind}/on'])} / {min(cached[f'{n}/{kind}/off'])}",
                ]
            )
    markdown = markdown_table(
        [
            "disk restore, wall s",
            "decision on, median",
            "decision off (opted out), median",
            "on / off",
            "fewest cached tokens on / off",
        ],
        rows,
    )
    markdown += (
        f"\n\nMedians of {reps} per cell, both settings in one engine, ABBA. Verdicts: {verdicts}."
    )
    bench.config.update(lengths=lengths, reps=reps, batch=batch, host_pool=host_pool)
    report = {"samples": samples, "cached": cached, "verdicts": verdicts}
    bench.write("decision-same-engine", report, markdown)
    return report
