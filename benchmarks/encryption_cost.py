"""What encryption at rest costs a disk restore: TTFT with sealing off and on, engines in ABBA.

A restore of a sealed record decrypts it (AES-256-GCM, in place) where a plain one is
checksummed; a put seals it on the tier's threads while the engine computes. One engine per
setting cannot tell that cost from the engine-to-engine spread (up to ±15 % between two
engines of one configuration here), so each setting is spread over several engines in ABBA
order:

1. per setting (off, on) a writer engine (kvtier disk tier, that setting) serves ``reps``
   distinct prompts per length cold and is closed. Its TTFTs are the cold reference, taken
   in an engine of that setting (its stores seal on the tier's threads during the prefills);
2. ``2 * rounds`` reader engines, settings off, on, on, off, ...; each restores from a
   folder of its own, a copy of its setting's written folder (so no reader sees another's
   touches, index changes or decision files), the page cache dropped before it starts (root
   only; recorded). Each reader serves one short prompt cold (the engine's first request
   pays one-off costs), then per prompt: a disk restore in the fresh process,
   ``reset_prefix_cache(reset_connector=True)``, and a second disk restore.

The restore decision is off in every engine: the restore is what is timed, and a decision
that chose to recompute would time a prefill instead. TTFT is the wall time of a
``max_tokens=1`` generate call. Reported per length and kind: the median over every engine of
the setting, on / off, the per-engine medians (their spread is the noise floor), the cold
medians; and the seal/open GB/s of one core (``benchmarks.store_bench.seal_rates``). Raw
samples go to ``encryption.json``.

Run: ``python -m benchmarks encryption --out bench-out``.
"""

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvtier
from benchmarks.decision_abba import KINDS
from benchmarks.store_bench import seal_rates
from kvtier.bench.common import FLUSH_TOKENS, BenchRun, abba_round, flush_stores
from kvtier.bench.report import drop_page_cache, markdown_table, median

SETTINGS = ("off", "on")
#: Tokens of the short cold prompt each reader serves first.
FIRST_TOKENS = 256
#: MiB per pass and passes of the seal/open figures.
SEAL_MIB, SEAL_REPEATS = 64, 5


def reader_order(rounds: int) -> list[str]:
    """Off, on, on, off, off, on, ...: each setting as often first as second."""
    return [setting for r in range(rounds) for setting in abba_round(SETTINGS, r)]


def settle_stores(
    engine: Any, folder: Path, flush_prompt: list[int], timeout_s: float = 60.0
) -> int:
    """Step the engine (``flush_stores``) until the folder's record count stops growing, so a
    writer closed next leaves every block of its last prompt on disk (vLLM submits a step's
    stores at the next step and cascades host-pool blocks in later steps); returns the count.
    The readers check what they restore, so a count that settled early fails loudly there."""
    deadline = time.monotonic() + timeout_s
    count, steady = -1, 0
    while steady < 2 and time.monotonic() < deadline:
        flush_stores(engine, flush_prompt)
        time.sleep(0.2)
        now = sum(1 for _ in folder.glob("*/blocks/*/*.kvb"))
        steady = steady + 1 if now == count else 0
        count = now
    return count


def write_master_key(path: Path) -> Path:
    """A random master key in a file only this user can read (what the key files need)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(32).hex().encode() + b"\n")
    finally:
        os.close(fd)
    return path


def run(
    model: str,
    lengths: list[int],
    reps: int,
    out: Path,
    rounds: int = 2,
    host_pool: str = "4GiB",
    progress: Callable[[str], None] = print,
    in_process: bool = False,
) -> dict:
    """Write ``encryption.json`` and ``encryption.md`` under ``out``."""
    bench = BenchRun(
        out, model, max_model_len=max(lengths) + 64, max_num_seqs=1, in_process=in_process
    )
    key_file = write_master_key(out / "bench-master-key")

    def config(setting: str, folder: Path) -> dict:
        keys = [key_file] if setting == "on" else None
        return kvtier.kv_transfer_config(
            host_pool=host_pool,
            disk_dir=folder,
            restore_decision=False,
            encryption_key_files=keys,
        )

    prompts = {(n, r): bench.prompt(n * 1000 + r, n) for n in lengths for r in range(reps)}
    written = {s: out / f"disk-encryption-{s}-written" for s in SETTINGS}
    cold: dict[str, dict[str, list[float]]] = {s: {} for s in SETTINGS}
    for setting in SETTINGS:
        shutil.rmtree(written[setting], ignore_errors=True)
        with bench.engine(f"writer-{setting}", config(setting, written[setting])) as engine:
            engine.generate_one(bench.prompt(1, FIRST_TOKENS))
            for (n, _), prompt in prompts.items():
                result, seconds = engine.generate_one(prompt)
                if result.num_cached_tokens:
                    raise RuntimeError(f"the cold run of {n} tokens was a cache hit")
                cold[setting].setdefault(str(n), []).append(seconds)
                progress(f"writer {setting}: {n:>5} tok cold {seconds:7.3f} s")
            flush = bench.prompt(2, FLUSH_TOKENS)
            records = settle_stores(engine, written[setting], flush)
            progress(f"writer {setting}: {records} records on disk")
    # per engine: {"setting": "on"/"off", "samples": {f"{n}/{kind}": [s, ...]}}
    engines: list[dict] = []
    dropped: list[bool] = []
    for i, setting in enumerate(reader_order(rounds)):
        folder = out / f"disk-encryption-reader-{i}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(written[setting], folder)
        dropped.append(drop_page_cache())
        samples: dict[str, list[float]] = {}
        with bench.engine(f"reader-{i}-{setting}", config(setting, folder)) as engine:
            engine.generate_one(bench.prompt(10**6 + i, FIRST_TOKENS))
            for (n, _), prompt in prompts.items():
                for kind in KINDS:
                    result, seconds = engine.generate_one(prompt)
                    if result.num_cached_tokens < n // 128 * 128 - 128:
                        raise RuntimeError(
                            f"reader {i} ({setting}): {n} tokens restored only in part "
                            f"({result.num_cached_tokens} cached)"
                        )
                    samples.setdefault(f"{n}/{kind}", []).append(seconds)
                    progress(f"reader {i} ({setting}): {n:>5} tok {kind:<5} {seconds:7.3f} s")
                    engine.reset_prefix_cache(reset_connector=True)
        shutil.rmtree(folder, ignore_errors=True)
        engines.append({"setting": setting, "samples": samples})
    for folder in written.values():
        shutil.rmtree(folder, ignore_errors=True)
    key_file.unlink()
    seal_table, seal_raw = seal_rates(SEAL_MIB, SEAL_REPEATS)
    markdown = table(engines, cold, lengths) + "\n\n" + seal_table
    bench.config.update(
        lengths=lengths,
        reps=reps,
        rounds=rounds,
        reader_order=reader_order(rounds),
        host_pool=host_pool,
        restore_decision=False,
        page_cache_dropped_before_readers=all(dropped),
        seal_rates=f"{SEAL_MIB} MiB per pass, median of {SEAL_REPEATS}, one thread",
    )
    report = {"engines": engines, "cold": cold, "seal_rates": seal_raw}
    bench.write("encryption", report, markdown)
    return report


def table(engines: list[dict], cold: dict[str, dict[str, list[float]]], lengths: list[int]) -> str:
    """One row per length and kind: pooled medians off / on, on / off, per-engine medians and
    the writers' cold medians."""
    rows = []
    for n in lengths:
        for kind in KINDS:
            cell = f"{n}/{kind}"
            per_engine = {
                s: [median(e["samples"][cell]) for e in engines if e["setting"] == s]
                for s in SETTINGS
            }
            pooled = {
                s: median([x for e in engines if e["setting"] == s for x in e["samples"][cell]])
                for s in SETTINGS
            }
            rows.append(
                [
                    f"{n} tokens, {'fresh process' if kind == 'fresh' else 'second read'}",
                    f"{pooled['off']:.3f}",
                    f"{pooled['on']:.3f}",
                    f"{pooled['on'] / pooled['off']:.3f}",
                    " / ".join(f"{x:.3f}" for x in per_engine["off"]),
                    " / ".join(f"{x:.3f}" for x in per_engine["on"]),
                    " / ".join(f"{median(cold[s][str(n)]):.3f}" for s in SETTINGS),
                ]
            )
    return markdown_table(
        [
            "disk restore TTFT s",
            "encryption off, median",
            "encryption on, median",
            "on / off",
            "per engine, off",
            "per engine, on",
            "cold prefill off / on, median",
        ],
        rows,
    )
