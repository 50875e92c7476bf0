"""N concurrent restores vs N concurrent cold prefills of the same size, N = 1, 2, 4, 8.

For each N, N fresh prompts are sent as one batch (all cold: ``num_cached_tokens == 0`` is
checked on every request), the engine cache and host pool are emptied
(``reset_prefix_cache(reset_connector=True)``), and the same N prompts are sent again as one
batch, now restored from kvtier's disk tier. Reported: the batch wall time (all first tokens out)
and the median per-request TTFT vLLM recorded, both ways, and their ratio.

With ``source="standalone"`` or ``"cluster"`` (the shared tier on a throw-away loopback
server): a writer engine with only the shared tier serves every batch cold and is closed (its
stores drain to the server); then a fresh engine with an *empty* local disk folder and the
shared tier (``disk_dir`` + ``shared``) serves the same batches, each restored from the server.

``decisions=(True, False)`` (disk source): the whole run once per setting of the restore
decision, each in its own engine (which has measured its prefill by its first restore, so the
decision is really taken), rows side by side.

Run: ``kvtier bench concurrent --out bench-out`` (``--source standalone`` for the shared tier).
"""

from collections.abc import Callable
from pathlib import Path

import kvtier
from kvtier.bench.common import FLUSH_TOKENS, BenchRun, bar_plot, flush_stores
from kvtier.bench.harness import GenerateResult
from kvtier.bench.report import markdown_table, median

#: Restore sources: kvtier's disk tier in the same engine, or the shared tier in a fresh one.
SOURCES = ("disk", "standalone", "cluster")


def run(
    model: str,
    prompt_len: int,
    counts: list[int],
    out: Path,
    host_pool: str = "4GiB",
    progress: Callable[[str], None] = print,
    in_process: bool = False,
    source: str = "disk",
    decisions: tuple[bool, ...] = (False,),
) -> dict:
    """Measure each N of ``counts``; write ``concurrent.json``, ``.md`` and ``.png`` under
    ``out`` (``concurrent-<source>.*`` for a shared source). ``decisions``: the restore
    decision's settings to run (disk source; the default, off, restores every hit)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; use one of {SOURCES}")
    if source != "disk" and decisions != (False,):
        raise ValueError("decisions: only the disk source compares the restore decision")
    bench = BenchRun(
        out, model, max_model_len=prompt_len + 64, max_num_seqs=max(counts), in_process=in_process
    )
    if source == "disk":
        rows = [
            row
            for decision in decisions
            for row in _disk_rows(bench, prompt_len, counts, out, host_pool, progress, decision)
        ]
    else:
        from kvtier.bench.ttft import servers

        with servers([source]) as urls:
            rows = _shared_rows(bench, prompt_len, counts, out, host_pool, progress, urls[source])
    return _write(bench, rows, prompt_len, counts, host_pool, out, source)


def _prompts(bench: BenchRun, n: int, prompt_len: int) -> list[list[int]]:
    return [bench.prompt(7_000_000 + n * 100 + i, prompt_len) for i in range(n)]


def _row(
    n: int,
    prompt_len: int,
    cold: list[GenerateResult],
    cold_s: float,
    restored: list[GenerateResult],
    restore_s: float,
) -> dict:
    """One N's figures; raises if a cold run was a hit or a restore was not one."""
    if any(r.num_cached_tokens for r in cold):
        raise RuntimeError(f"N={n}: a cold prefill was a cache hit")
    if any(r.num_cached_tokens == 0 for r in restored):
        raise RuntimeError(f"N={n}: a request was not restored; the run would mislead")
    return {
        "n": n,
        "prefill_batch_s": cold_s,
        "restore_batch_s": restore_s,
        "prefill_ttft_median_s": median([r.ttft_s or cold_s for r in cold]),
        "restore_ttft_median_s": median([r.ttft_s or restore_s for r in restored]),
        "restored_cached_tokens": [r.num_cached_tokens for r in restored],
        "prefill_tokens_per_s": n * prompt_len / cold_s,
    }


def _shared_rows(
    bench: BenchRun,
    prompt_len: int,
    counts: list[int],
    out: Path,
    host_pool: str,
    progress: Callable[[str], None],
    url: str,
) -> list[dict]:
    """Cold batches in a writer with only the shared tier; restores in a fresh engine whose
    local disk folder starts empty."""
    colds = {}
    writer = kvtier.kv_transfer_config(host_pool=host_pool, shared=url)
    with bench.engine("writer-shared", writer) as engine:
        engine.generate_one(bench.prompt(2, 256))  # warm-up
        for n in counts:
            colds[n] = engine.generate(_prompts(bench, n, prompt_len))
            progress(f"N={n}: {n} prefills {colds[n][1]:.2f} s")
        flush_stores(engine, bench.prompt(8_000_000, FLUSH_TOKENS))
    disk = out / "disk-concurrent-shared"
    if any(disk.rglob("*.kvb")):
        raise RuntimeError(f"{disk} is not empty; the restores would not come from the server")
    rows = []
    reader = kvtier.kv_transfer_config(
        host_pool=host_pool, disk_dir=disk, shared=url, restore_decision=False
    )
    with bench.engine("reader-shared", reader) as engine:
        engine.generate_one(bench.prompt(3, 256))  # warm-up (a prompt the writer never saw)
        for n in counts:
            restored, restore_s = engine.generate(_prompts(bench, n, prompt_len))
            rows.append(_row(n, prompt_len, *colds[n], restored, restore_s))
            progress(f"N={n}: {n} shared restores {restore_s:.2f} s")
    return rows


def _disk_rows(
    bench: BenchRun,
    prompt_len: int,
    counts: list[int],
    out: Path,
    host_pool: str,
    progress: Callable[[str], None],
    restore_decision: bool,
) -> list[dict]:
    # N concurrent *restores* are measured: with the decision on, a request it refused would
    # fail the run (``_row``). Each setting gets its own folder: no run restores another's.
    setting = "on" if restore_decision else "off"
    config = kvtier.kv_transfer_config(
        host_pool=host_pool,
        disk_dir=out / f"disk-concurrent-decision-{setting}",
        restore_decision=restore_decision,
    )
    rows = []
    with bench.engine(f"kvtier-decision-{setting}", config) as engine:
        engine.generate_one(bench.prompt(2, 256))  # warm-up
        for n in counts:
            prompts = _prompts(bench, n, prompt_len)
            cold, cold_s = engine.generate(prompts)
            flush_stores(engine, bench.prompt(8_000_000 + n, FLUSH_TOKENS))
            engine.reset_prefix_cache(reset_connector=True)
            restored, restore_s = engine.generate(prompts)
            rows.append(
                _row(n, prompt_len, cold, cold_s, restored, restore_s) | {"decision": setting}
            )
            progress(
                f"N={n}, decision {setting}: {n} prefills {cold_s:.2f} s, {n} restores "
                f"{restore_s:.2f} s ({cold_s / restore_s:.1f}×)"
            )
    return rows


def _write(
    bench: BenchRun,
    rows: list[dict],
    prompt_len: int,
    counts: list[int],
    host_pool: str,
    out: Path,
    source: str,
) -> dict:
    what = "disk restores" if source == "disk" else f"shared {source} restores (fresh, empty disk)"
    stem = "concurrent" if source == "disk" else f"concurrent-{source}"
    bench.config.update(prompt_len=prompt_len, counts=counts, host_pool=host_pool, source=source)
    settings = {r.get("decision", "off") for r in rows}
    markdown = markdown_table(
        [
            "N" if len(settings) == 1 else "N, restore decision",
            f"N cold prefills of {prompt_len} tok (s)",
            f"N {what} (s)",
            "speed-up",
            "median TTFT prefill / restore (s)",
            "aggregate prefill tok/s",
            "restored tokens",
        ],
        [
            [
                r["n"] if len(settings) == 1 else f"{r['n']}, {r['decision']}",
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
    bench.write(stem, {"rows": rows}, markdown)
    bar_plot(
        out / f"{stem}.png",
        f"N concurrent requests of {prompt_len} tokens",
        [f"N={r['n']}" + ("" if len(settings) == 1 else f", {r['decision']}") for r in rows],
        {
            "cold prefills": [r["prefill_batch_s"] for r in rows],
            what: [r["restore_batch_s"] for r in rows],
        },
        "seconds",
        log=True,
    )
    return {"rows": rows}
