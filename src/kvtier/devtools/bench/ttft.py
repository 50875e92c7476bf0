"""Time to first token: cold prefill vs host-pool restore vs disk restore, kvtier vs stock fs.

One run, three engines, one set of cold prefills:

1. engine W writes: both disk tiers configured (kvtier's and vLLM's stock ``fs``, write-through
   to both). Per prompt: cold (``num_cached_tokens == 0`` checked), engine prefix-cache hit,
   host-pool restore (after ``reset_prefix_cache()``).
2. page cache dropped (root only), fresh engine with only kvtier's disk tier: per prompt, disk
   restore in a fresh process (cold disk), then ``reset_prefix_cache(reset_connector=True)``
   and disk restore again (page cache warm).
3. the same with only the stock ``fs`` tier.
4. with ``shared`` topologies (``"standalone"``, ``"cluster"``): the writer also writes through
   to a shared tier on a throw-away server (``kvtier.devtools.redis_servers``, loopback) of the
   first topology; one engine holds one shared tier, so a second topology's server is seeded
   with the same values copied byte for byte (``copy_values``: keys and records do not depend
   on the topology, and every restore verifies them). Then per topology a fresh engine with
   an *empty* local disk folder and that shared tier (``disk_dir`` + ``shared``: local disk
   first, then the server) serves every prompt (shared restore, fresh process), and again
   after ``reset_prefix_cache(reset_connector=True)`` (second read: the blocks written back to
   its local disk). kvtier's tier counters over the fresh restores (``kvtier:tier_bytes_read``
   / ``kvtier:tier_io_seconds`` of reads) give the restore bandwidth through the tier.

TTFT is the wall time of a ``max_tokens=1`` generate call. Each cell is the median over
``reps`` distinct prompts of that length with min–max.

Run: ``kvtier bench ttft --out bench-out`` (about 15 minutes on 2 cores at 2k/4k/8k);
``--shared standalone,cluster`` adds the shared tier.
"""

import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
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
SHARED_KINDS = {
    "standalone_fresh": "shared standalone, fresh process (empty disk)",
    "standalone_warm": "shared standalone, in process (written-back disk)",
    "cluster_fresh": "shared 3-master Cluster, fresh process (empty disk)",
    "cluster_warm": "shared 3-master Cluster, in process (written-back disk)",
}
TOPOLOGIES = ("standalone", "cluster")
#: Server memory per standalone server / per Cluster node: room for every prompt of a run.
SERVER_MEMORY = 2 * 2**30
#: Read counters: vLLM's per-tier bytes promoted and read time, and kvtier's own verified
#: payload bytes and seconds in store reads (vLLM's read time stays 0 for tiers that do not
#: report it, so the bandwidth is taken from kvtier's pair).
READ_BYTES, READ_TIME = "vllm:kv_offload_tiering_read_bytes", "vllm:kv_offload_tiering_read_time"
TIER_BYTES, TIER_SECONDS = "kvtier:tier_bytes_read", "kvtier:tier_io_seconds"

Progress = Callable[[str], None]


def run(
    model: str,
    lengths: list[int],
    reps: int,
    out: Path,
    host_pool: str = "4GiB",
    progress: Progress = print,
    in_process: bool = False,
    shared: Sequence[str] = (),
    restore_decision: bool = True,
) -> dict:
    """Measure every kind of ``KINDS`` (and ``SHARED_KINDS`` of the ``shared`` topologies) per
    length; write ``ttft.json``, ``ttft.md`` and ``ttft.png`` under ``out``."""
    unknown = set(shared) - set(TOPOLOGIES)
    if unknown:
        raise ValueError(f"unknown shared topology {sorted(unknown)}; use {TOPOLOGIES}")
    with servers(shared) as urls:
        return _run(
            model, lengths, reps, out, host_pool, progress, in_process, urls, restore_decision
        )


@contextmanager
def servers(topologies: Sequence[str]) -> Iterator[dict[str, str]]:
    """Throw-away servers on loopback, one per topology: topology -> URL; killed on exit."""
    if not topologies:
        yield {}
        return
    from kvtier.devtools.redis_servers import start_cluster, start_standalone

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvtier-ttft-redis-")))
        urls = {}
        if "standalone" in topologies:
            server = start_standalone(tmp / "standalone", maxmemory_bytes=SERVER_MEMORY)
            stack.callback(server.kill)
            urls["standalone"] = server.url
        if "cluster" in topologies:
            cluster = start_cluster(tmp / "cluster", maxmemory_bytes=SERVER_MEMORY)
            stack.callback(cluster.stop)
            urls["cluster"] = cluster.url
        yield urls


def copy_values(source_url: str, target_url: str) -> int:
    """Copy every kvtier value (``kvt:*``) from one server to another unchanged; returns the
    count. The bench's stand-in for a writer engine per topology (an engine holds one shared
    tier): the reader verifies every record it restores either way."""
    from kvtier.devtools.bench.shared_bench import plain_client

    source, target = plain_client(source_url), plain_client(target_url)
    try:
        copied = 0
        for key in source.scan_iter(match=b"kvt:*", count=1000):
            value = source.get(key)
            if value is not None:
                target.set(key, value)
                copied += 1
        return copied
    finally:
        source.close()
        target.close()


def read_counters(metrics: dict[str, float]) -> dict[str, float]:
    """Read bytes and seconds summed over every tier of one engine (``READ_*``, ``TIER_*``)."""
    counters = {
        name: sum(v for k, v in metrics.items() if k.startswith(name))
        for name in (READ_BYTES, READ_TIME, TIER_BYTES)
    }
    counters[TIER_SECONDS] = sum(
        v for k, v in metrics.items() if k.startswith(TIER_SECONDS) and "direction=read" in k
    )
    return counters


def _run(
    model: str,
    lengths: list[int],
    reps: int,
    out: Path,
    host_pool: str,
    progress: Progress,
    in_process: bool,
    urls: dict[str, str],
    restore_decision: bool,
) -> dict:
    kinds = {**KINDS, **{k: v for k, v in SHARED_KINDS.items() if k.split("_")[0] in urls}}
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
    for url in list(urls.values())[:1]:  # write-through to the first shared server too
        both["kv_connector_extra_config"]["secondary_tiers"] += kvtier.kv_transfer_config(
            shared=url
        )["kv_connector_extra_config"]["secondary_tiers"]
    samples: dict[str, dict[str, list[dict]]] = {str(n): {k: [] for k in kinds} for n in lengths}
    prompts = {(n, r): bench.prompt(n * 1000 + r, n) for n in lengths for r in range(reps)}

    def record(n: int, kind: str, result, elapsed: float) -> None:
        samples[str(n)][kind].append({"ttft_s": elapsed, "cached": result.num_cached_tokens})
        progress(
            f"{n:>5} tok  {kinds[kind]:<52} {elapsed:8.3f} s  cached={result.num_cached_tokens}"
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
    through_tier = {}
    seeded = {t: copy_values(*urls.values()) for t in list(urls)[1:]}
    for topology, url in urls.items():
        config = kvtier.kv_transfer_config(
            host_pool=host_pool,
            disk_dir=out / f"disk-shared-{topology}",
            shared=url,
            restore_decision=restore_decision,
        )
        with bench.engine(f"reader-shared-{topology}", config) as engine:
            if any((out / f"disk-shared-{topology}").rglob("*.kvb")):
                raise RuntimeError(f"the {topology} reader's disk folder is not empty")
            before = read_counters(engine.metrics())
            for (n, _), prompt in prompts.items():
                record(n, f"{topology}_fresh", *engine.generate_one(prompt))
            after = read_counters(engine.metrics())
            through_tier[topology] = {k: after[k] - before[k] for k in after}
            for (n, _), prompt in prompts.items():
                engine.reset_prefix_cache(reset_connector=True)
                record(n, f"{topology}_warm", *engine.generate_one(prompt))
    bench.config.update(
        shared_servers=urls,
        shared_seeded_by_copy=seeded,
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
    report = {"samples": samples, "summary_ttft_s": summary, "shared_read": through_tier}
    markdown = table(samples, lengths, kinds) + shared_read_lines(through_tier)
    bench.write("ttft", report, markdown)
    plot(samples, lengths, out / "ttft.png", kinds)
    return report


def shared_read_lines(through_tier: dict[str, dict[str, float]]) -> str:
    """One line per topology: bytes restored over tier read time during the fresh restores."""
    lines = []
    for topology, c in through_tier.items():
        rate = c[TIER_BYTES] / c[TIER_SECONDS] / 1e9 if c[TIER_SECONDS] > 0 else float("nan")
        lines.append(
            f"\n\nshared {topology}, fresh restores: {c[TIER_BYTES] / 2**20:.1f} MiB verified "
            f"in {c[TIER_SECONDS]:.3f} s of tier read time = {rate:.3f} GB/s "
            f"(vLLM: {c[READ_BYTES] / 2**20:.1f} MiB promoted)"
        )
    return "".join(lines)


def medians(samples: dict, lengths: list[int], kind: str) -> list[float]:
    return [median([s["ttft_s"] for s in samples[str(n)][kind]]) for n in lengths]


def table(samples: dict, lengths: list[int], kinds: dict[str, str] = KINDS) -> str:
    rows = []
    for kind, label in kinds.items():
        cells = []
        for n in lengths:
            runs = samples[str(n)][kind]
            cached = "/".join(str(c) for c in sorted({s["cached"] for s in runs}))
            cells.append(f"{median_range([s['ttft_s'] for s in runs])} [{cached}]")
        rows.append([label, *cells])
    cold = medians(samples, lengths, "cold")
    fresh = [k for k in kinds if k.endswith("_fresh") and not k.startswith("fs")]
    for kind in ("host_restore", *fresh, "fs_fresh"):
        ratios = [c / r for c, r in zip(cold, medians(samples, lengths, kind), strict=True)]
        rows.append([f"cold / {kinds[kind]}", *(f"{x:.1f}×" for x in ratios)])
    for kind in (k for k in fresh if k != "kvtier_fresh"):
        vs = [
            s / k
            for s, k in zip(
                medians(samples, lengths, kind),
                medians(samples, lengths, "kvtier_fresh"),
                strict=True,
            )
        ]
        rows.append([f"{kinds[kind]} / kvtier disk", *(f"{x:.2f}" for x in vs)])
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


def plot(samples: dict, lengths: list[int], path: Path, kinds: dict[str, str] = KINDS) -> None:
    bar_plot(
        path,
        "Time to first token, SmolLM2-135M fp32, 2 CPU cores (log scale)",
        [f"{n} tok" for n in lengths],
        {kinds[k]: medians(samples, lengths, k) for k in kinds},
        "seconds",
        log=True,
    )
