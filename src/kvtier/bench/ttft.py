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
   to a shared tier on a throw-away server (``kvtier.bench.redis_servers``, loopback) of the
   first topology; one engine holds one shared tier, so a second topology's server is seeded
   with the same values copied byte for byte (``copy_values``: keys and records do not depend
   on the topology, and every restore verifies them). Then per topology a fresh engine with
   an *empty* local disk folder and that shared tier (``disk_dir`` + ``shared``: local disk
   first, then the server) serves every prompt (shared restore, fresh process), and again
   after ``reset_prefix_cache(reset_connector=True)`` (second read: the blocks written back to
   its local disk). kvtier's tier counters over the fresh restores (``kvtier:tier_bytes_read``
   / ``kvtier:tier_io_seconds`` of reads) give the restore bandwidth through the tier.

Every reader engine first prefills ``WARMUP_PROMPTS`` unrelated prompts cold, so that it has
measured its prefill cost and the restore decision is really taken for each restore (a fresh
engine that never prefilled restores every hit unweighed); the verdicts each reader's tiers
gave are recorded. ``decisions=(True, False)`` runs every kvtier reader twice, decision on
and off, alternating which goes first per reader: the decision's cost side by side.

TTFT is the wall time of a ``max_tokens=1`` generate call. Each cell is the median over
``reps`` distinct prompts of that length with min–max.

Run: ``kvtier bench ttft --out bench-out`` (about 15 minutes on 2 cores at 2k/4k/8k);
``--shared standalone,cluster`` adds the shared tier.
"""

import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import kvtier
from kvtier.bench.common import BenchRun, bar_plot
from kvtier.bench.report import (
    counter,
    decision_verdicts,
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
#: Kinds a reader engine measures, which the decision may change (``decisions``).
READER_KINDS = ("kvtier_fresh", "kvtier_warm", *SHARED_KINDS)
#: Cold prompts (of ``WARMUP_TOKENS``) each reader prefills first: prefill measured.
WARMUP_PROMPTS, WARMUP_TOKENS = 3, 512
OFF = "_decision_off"
#: kvtier counters that explain a partly restored prompt, reported per reader: a load given
#: up at its deadline, a failed load, a shared server that stopped answering (a breaker that
#: opened and closed again counts one reconnect).
PARTIAL_CAUSES = {
    "loads abandoned": "kvtier:tier_loads_abandoned",
    "load failures": "kvtier:tier_load_failures",
    "reconnects": "kvtier:tier_reconnects",
}
#: Server memory per standalone server / per Cluster node: room for every block of a run
#: (3 reps at 2k/4k/8k and the readers' warm-ups: ~2.0 GB; 2 GiB once made the server evict
#: prefix blocks, and the shared rows restored a few blocks each). ``evicted_keys`` checks it.
SERVER_MEMORY = 4 * 2**30
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
    decisions: Sequence[bool] = (True,),
) -> dict:
    """Measure every kind of ``KINDS`` (and ``SHARED_KINDS`` of the ``shared`` topologies) per
    length; write ``ttft.json``, ``ttft.md`` and ``ttft.png`` under ``out``.

    ``decisions``: the restore decision on (True) and/or off (False) for the kvtier readers;
    both: each reader twice, the second setting's kinds suffixed ``OFF`` or not.
    """
    unknown = set(shared) - set(TOPOLOGIES)
    if unknown:
        raise ValueError(f"unknown shared topology {sorted(unknown)}; use {TOPOLOGIES}")
    if not decisions or len(set(decisions)) != len(decisions):
        raise ValueError(f"decisions={decisions!r}: give (True,), (False,) or both")
    with servers(shared) as urls:
        return _run(model, lengths, reps, out, host_pool, progress, in_process, urls, decisions)


@contextmanager
def servers(topologies: Sequence[str]) -> Iterator[dict[str, str]]:
    """Throw-away servers on loopback, one per topology: topology -> URL; killed on exit."""
    if not topologies:
        yield {}
        return
    from kvtier.bench.redis_servers import start_cluster, start_standalone

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
    from kvtier.bench.shared_bench import plain_client

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


def server_releases(urls: dict[str, str]) -> dict[str, str]:
    """Each topology's server product and release ("Valkey 9.1.2"), for the report."""
    if not urls:
        return {}
    from kvtier.bench.shared_bench import server_release

    return {topology: server_release(url) for topology, url in urls.items()}


def evicted_keys(url: str) -> int:
    """Keys the server (every node of a Cluster) evicted since it started: a shared row whose
    server evicted keys restored less than the tier could."""
    import redis

    hosts = url.split("://", 1)[1].split("/")[0].split(",")
    total = 0
    for host in hosts:
        name, _, port = host.rpartition(":")
        client = redis.Redis(host=name, port=int(port))
        try:
            total += int(client.info("stats")["evicted_keys"])
        finally:
            client.close()
    return total


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
    decisions: Sequence[bool],
) -> dict:
    kinds = {**KINDS, **{k: v for k, v in SHARED_KINDS.items() if k.split("_")[0] in urls}}
    compare = len(decisions) > 1
    if compare:
        kinds |= {f"{k}{OFF}": f"{kinds[k]}, decision off" for k in READER_KINDS if k in kinds}
    restore_decision = decisions[0]
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
    dropped: list[bool] = []
    verdicts: dict[str, dict[str, float]] = {}
    warmups = iter(range(10**6, 2 * 10**6))

    @contextmanager
    def reader(name: str, config: dict) -> Iterator[Any]:
        """A reader engine that has measured its prefill (see the module docstring)."""
        engine = bench.engine(name, config)
        with engine:
            for _ in range(WARMUP_PROMPTS):
                engine.generate_one(bench.prompt(next(warmups), min(WARMUP_TOKENS, max(lengths))))
            yield engine
            metrics = engine.metrics()
            verdicts[name] = decision_verdicts(metrics) | {
                label: counter(metrics, name) for label, name in PARTIAL_CAUSES.items()
            }

    def settings(i: int) -> list[tuple[bool, str]]:
        """(decision, kind suffix) per pass of reader ``i``, alternating which goes first."""
        order = list(decisions) if i % 2 == 0 else list(reversed(decisions))
        return [(d, OFF if compare and not d else "") for d in order]

    for i, (tier, disk_dir, fresh, warm) in enumerate(
        (("kvtier", kv_dir, "kvtier_fresh", "kvtier_warm"), ("fs", fs_dir, "fs_fresh", "fs_warm"))
    ):
        for decision, suffix in settings(i) if tier == "kvtier" else [(restore_decision, "")]:
            dropped.append(drop_page_cache())
            config = kvtier.kv_transfer_config(
                host_pool=host_pool, disk_dir=disk_dir, disk_tier=tier, restore_decision=decision
            )
            with reader(f"reader-{tier}{suffix}", config) as engine:
                for (n, _), prompt in prompts.items():
                    record(n, fresh + suffix, *engine.generate_one(prompt))
                    engine.reset_prefix_cache(reset_connector=True)
                    record(n, warm + suffix, *engine.generate_one(prompt))
    through_tier = {}
    seeded = {t: copy_values(*urls.values()) for t in list(urls)[1:]}
    for i, (topology, url) in enumerate(urls.items()):
        for decision, suffix in settings(i + 1):
            disk_dir = out / f"disk-shared-{topology}{suffix}"
            config = kvtier.kv_transfer_config(
                host_pool=host_pool, disk_dir=disk_dir, shared=url, restore_decision=decision
            )
            with reader(f"reader-shared-{topology}{suffix}", config) as engine:
                before = read_counters(engine.metrics())
                for (n, _), prompt in prompts.items():
                    record(n, f"{topology}_fresh{suffix}", *engine.generate_one(prompt))
                after = read_counters(engine.metrics())
                through_tier[topology + suffix] = {k: after[k] - before[k] for k in after}
                for (n, _), prompt in prompts.items():
                    engine.reset_prefix_cache(reset_connector=True)
                    record(n, f"{topology}_warm{suffix}", *engine.generate_one(prompt))
    evicted = {topology: evicted_keys(url) for topology, url in urls.items()}
    releases = server_releases(urls)
    bench.config.update(
        shared_servers=urls,
        shared_server_releases=releases,
        shared_server_evicted_keys=evicted,
        shared_seeded_by_copy=seeded,
        lengths=lengths,
        reps=reps,
        host_pool=host_pool,
        restore_decisions=list(decisions),
        reader_warmup=f"{WARMUP_PROMPTS} cold prompts of {WARMUP_TOKENS} tokens",
        page_cache_dropped_before_fresh_processes=all(dropped),
    )
    summary = {
        n: {kind: summarize([s["ttft_s"] for s in runs]).as_dict() for kind, runs in kinds.items()}
        for n, kinds in samples.items()
    }
    report = {
        "samples": samples,
        "summary_ttft_s": summary,
        "shared_read": through_tier,
        "reader_verdicts": verdicts,
    }
    markdown = (
        table(samples, lengths, kinds)
        + "".join(
            f"\n\n**The {t} server evicted {n} keys**: its rows restored less than they could."
            for t, n in evicted.items()
            if n
        )
        + "".join(f"\n\nShared {t} server: {r}." for t, r in releases.items())
        + shared_read_lines(through_tier)
        + verdict_lines(verdicts)
    )
    bench.write("ttft", report, markdown)
    plot(samples, lengths, out / "ttft.png", kinds)
    return report


def verdict_lines(verdicts: dict[str, dict[str, float]]) -> str:
    """One line per reader: how many requests' hits each verdict got, and the counters that
    would explain a partial restore."""
    lines = []
    for name, counts in verdicts.items():
        said = {v: n for v, n in counts.items() if v not in PARTIAL_CAUSES}
        faults = ", ".join(f"{c} {int(counts.get(c, 0))}" for c in PARTIAL_CAUSES)
        decided = ", ".join(f"{v} {int(n)}" for v, n in sorted(said.items())) or "none"
        lines.append(f"\n\n{name}: restore decisions {decided}; {faults}")
    return "".join(lines)


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
    for kind in (k for k in READER_KINDS if f"{k}{OFF}" in kinds):
        on_off = [
            a / b
            for a, b in zip(
                medians(samples, lengths, kind),
                medians(samples, lengths, f"{kind}{OFF}"),
                strict=True,
            )
        ]
        rows.append([f"{kinds[kind]}: decision on / off", *(f"{x:.2f}" for x in on_off)])
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
