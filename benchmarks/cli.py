"""``python -m benchmarks``: the project's own lab, run from a source checkout.

Design A/Bs (the restore decision on a throttled disk, decision on vs off), data-path and
store microbenchmarks, the host pool on disk, the GPU evidence of the restore policy, and
``publish``, which copies the test suites' reports into docs/. None of it ships in the wheel;
what a user runs against their own deployment is ``kvtier bench`` / ``kvtier probe``.
Commands import their module lazily, so one command's dependencies (torch for the GPU tools,
root for the throttled disk) never stop another from starting.
"""

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="kvtier's development benchmarks (a source checkout's lab; not in the wheel).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)

OutOption = Annotated[Path, typer.Option(help="Folder for tables (.md), raw data (.json), plots.")]
ModelOption = Annotated[
    str | None, typer.Option(help="HF model folder (default: SmolLM2-135M-Instruct from PyPI).")
]


def _model(model: str | None) -> str:
    from kvtier.bench.common import default_model

    return model or default_model()


@app.command("decision")
def bench_decision(
    out: OutOption = Path("bench-out"),
    model: ModelOption = None,
    lengths: Annotated[str, typer.Option(help="Prompt lengths, comma separated.")] = "2048,8000",
    reps: Annotated[int, typer.Option(help="Distinct prompts per length.")] = 3,
    engines: Annotated[
        int, typer.Option(help="Reader engines per setting (ABBA order: on, off, off, on...).")
    ] = 3,
    same_engine: Annotated[
        bool,
        typer.Option(
            "--same-engine",
            help="Both settings in one engine (per-request opt-out), singles and batches.",
        ),
    ] = False,
    batch: Annotated[int, typer.Option(help="Concurrent restores per batch (--same-engine).")] = 4,
) -> None:
    """Disk restores with the restore decision on vs off, spread over several engines each
    (or, with --same-engine, both in one engine).

    Example: python -m benchmarks decision --lengths 2048,8000 --engines 3
    """
    from benchmarks import decision_abba
    from kvtier.bench.console import print_result, progress

    if same_engine:
        with progress("decision") as report:
            decision_abba.run_same_engine(
                _model(model),
                [int(x) for x in lengths.split(",")],
                reps,
                out,
                batch=batch,
                progress=report,
            )
        print_result(out, "decision-same-engine")
        return
    with progress("decision") as report:
        decision_abba.run(
            _model(model),
            [int(x) for x in lengths.split(",")],
            reps,
            out,
            engines_per_setting=engines,
            progress=report,
        )
    print_result(out, "decision")


@app.command("encryption")
def bench_encryption(
    out: OutOption = Path("bench-out"),
    model: ModelOption = None,
    lengths: Annotated[str, typer.Option(help="Prompt lengths, comma separated.")] = "2048,8000",
    reps: Annotated[int, typer.Option(help="Distinct prompts per length.")] = 3,
    rounds: Annotated[
        int, typer.Option(help="ABBA rounds of reader engines (off, on, on, off...).")
    ] = 2,
) -> None:
    """Disk restores with encryption at rest off vs on, spread over several engines each, with
    the cold prefill and the seal/open GB/s of one core beside them.

    Example: python -m benchmarks encryption --lengths 2048,8000 --rounds 2
    """
    from benchmarks import encryption_cost
    from kvtier.bench.console import print_result, progress

    with progress("encryption") as report:
        encryption_cost.run(
            _model(model),
            [int(x) for x in lengths.split(",")],
            reps,
            out,
            rounds=rounds,
            progress=report,
        )
    print_result(out, "encryption")


@app.command("slow-tier")
def bench_slow_tier(
    out: OutOption = Path("slowtier-out"),
    model: Annotated[
        str | None, typer.Option(help="HF model folder (default: the tiny random Llama).")
    ] = None,
    lengths: Annotated[str, typer.Option(help="Prompt lengths, comma separated.")] = "2048,8000",
    slowdown: Annotated[
        float, typer.Option(help="Throttled restore / cold prefill at the largest length.")
    ] = 3.0,
    reps: Annotated[int, typer.Option(help="Requests per length and mode (medians).")] = 3,
    warm_prompts: Annotated[int, typer.Option(help="Cold prompts served first per engine.")] = 3,
    warm_restores: Annotated[
        int, typer.Option(help="Warm-up restores per engine and disk speed.")
    ] = 3,
) -> None:
    """TTFT of a disk-only prefix on a throttled and an unthrottled disk: restore decision
    off vs on vs cold prefill, timed in one engine per disk speed (root: loop device + cgroup
    v1 blkio throttle).

    Example: python -m benchmarks slow-tier --out slowtier-out --lengths 2048,8000
    """
    from benchmarks import slowtier
    from kvtier.bench.console import print_result, progress

    if model is None:
        from tests.support.models import tiny_llama

        model = str(tiny_llama())
    with progress("slow-tier") as report:
        slowtier.run(
            model,
            [int(x) for x in lengths.split(",")],
            out,
            slowdown=slowdown,
            reps=reps,
            warm_prompts=warm_prompts,
            warm_restores=warm_restores,
            progress=report,
        )
    print_result(out, "slowtier")


@app.command("bandwidth")
def bench_bandwidth(
    out: OutOption = Path("bench-out"),
    reps: Annotated[int, typer.Option(help="Passes.")] = 3,
) -> None:
    """Restore data path GB/s next to plain sequential reads and memcpy (no engine).

    Example: python -m benchmarks bandwidth --reps 3
    """
    from benchmarks import bandwidth
    from kvtier.bench.console import print_result, progress

    with progress("bandwidth") as report:
        bandwidth.run(out, reps=reps, progress=report)
    print_result(out, "bandwidth")


@app.command("disk-read")
def bench_disk_read(
    out: OutOption = Path("bench-out"),
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Folder on the disk to measure (default: TMPDIR).")
    ] = None,
    record_bytes: Annotated[int, typer.Option(help="Payload bytes per record.")] = 2 << 20,
    blocks: Annotated[int, typer.Option(help="Records read per pass.")] = 1024,
    threads: Annotated[str, typer.Option(help="Thread counts, comma separated.")] = "4,8,16,32",
    passes: Annotated[int, typer.Option(help="Passes per thread count.")] = 3,
    busy_python_thread: Annotated[
        bool, typer.Option(help="Run Python without pause on a thread beside the readers.")
    ] = False,
    page_cache: Annotated[
        str,
        typer.Option(
            help="cold: page cache dropped before each pass (root); warm: records made "
            "resident first, compared with a memcpy and a plain buffered read."
        ),
    ] = "cold",
    kinds: Annotated[
        str | None,
        typer.Option(
            help="kvtier kinds to measure, comma separated (e.g. tier-batch,reader; default: "
            "all); the plain reads (and memcpy, buffered with --page-cache warm) always run."
        ),
    ] = None,
) -> None:
    """kvtier's disk reads next to plain multi-threaded O_DIRECT reads of the same files.

    Example: python -m benchmarks disk-read --dir /var/tmp --blocks 1024
    """
    from benchmarks import disk_read
    from kvtier.bench.console import print_result, progress

    if page_cache not in ("cold", "warm"):
        raise typer.BadParameter(f"{page_cache!r}; choose cold or warm", param_hint="--page-cache")
    counts = tuple(int(t) for t in threads.split(","))
    only = None if kinds is None else tuple(k.strip() for k in kinds.split(","))
    try:
        with progress("disk-read") as report:
            disk_read.run(
                out,
                folder,
                record_bytes,
                blocks,
                counts,
                passes,
                report,
                busy_python_thread,
                page_cache,
                only,
            )
    except disk_read.UnknownKinds as exc:
        raise typer.BadParameter(str(exc), param_hint="--kinds") from None
    print_result(out, "disk-read")


@app.command("shared-busy")
def bench_shared_busy(
    out: OutOption = Path("bench-out"),
    sizes: Annotated[str, typer.Option(help="Payload bytes per record, comma separated.")] = (
        "5872025,16384"
    ),
    passes: Annotated[int, typer.Option(help="Passes per case and round.")] = 3,
    rounds: Annotated[int, typer.Option(help="Rounds (every case once each).")] = 2,
    url: Annotated[
        str | None, typer.Option(help="A standalone server (default: a throw-away one).")
    ] = None,
    threads: Annotated[
        str, typer.Option(help="Reader threads sharing the records, comma separated.")
    ] = "1",
    spinning_processes: Annotated[
        int, typer.Option(help="Processes spinning throughout (an engine's other processes).")
    ] = 0,
    windows: Annotated[
        str,
        typer.Option(help="Exchange windows in bytes, comma separated (default: the store's)."),
    ] = "",
) -> None:
    """The shared tier's reads beside a busy Python thread: a share in one exchange vs a GET each.

    Example: python -m benchmarks shared-busy --out bench-out --threads 1,4
    """
    from benchmarks import shared_busy
    from kvtier.bench.console import print_result, progress

    with progress("shared-busy") as report:
        shared_busy.run(
            out,
            [int(s) for s in sizes.split(",")],
            passes,
            rounds,
            report,
            url,
            [int(t) for t in threads.split(",")],
            spinning_processes,
            [int(w) for w in windows.split(",") if w],
        )
    print_result(out, "shared-busy")


@app.command("store")
def bench_store(
    folder: Annotated[
        Path | None,
        typer.Option("--dir", help="Folder on the disk to measure (default: TMPDIR)."),
    ] = None,
    total_mib: Annotated[int, typer.Option(help="MiB written per pass.")] = 192,
    repeats: Annotated[int, typer.Option(help="Passes per case.")] = 3,
    open_records: Annotated[int, typer.Option(help="Records indexed for open()/contains().")] = (
        100_000
    ),
    real_records: Annotated[int, typer.Option(help="Small records put for open().")] = 5_000,
    cold: Annotated[bool, typer.Option(help="Cold reads (drop_caches, root only).")] = True,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write raw per-pass figures here.")
    ] = None,
    read_ab_only: Annotated[
        bool, typer.Option("--read-ab-only", help="Only the O_DIRECT vs buffered read A/B.")
    ] = False,
    sealed_only: Annotated[
        bool,
        typer.Option(
            "--sealed-only",
            help="Only the sealing figures: seal/open GB/s per core, DiskStore plain vs "
            "sealed for one tenant and for many.",
        ),
    ] = False,
) -> None:
    """DiskStore throughput, latency and index figures next to plain file I/O (no engine).

    Example: python -m benchmarks store --json /tmp/store_bench.json
    """
    from benchmarks import store_bench

    store_bench.run(
        folder,
        total_mib=total_mib,
        repeats=repeats,
        open_records=open_records,
        real_records=real_records,
        cold=cold,
        json_path=json_path,
        read_ab_only=read_ab_only,
        emit=typer.echo,
        sealed_only=sealed_only,
    )


@app.command("checksum")
def bench_checksum(
    repeats: Annotated[int, typer.Option(help="Timed runs per cell.")] = 7,
) -> None:
    """GB/s of candidate payload checksums over realistic block sizes (no engine).

    Example: python -m benchmarks checksum --repeats 7
    """
    from benchmarks import checksum_bench

    typer.echo(checksum_bench.run(repeats))


@app.command("write-cost")
def bench_write_cost(
    sizes: Annotated[str, typer.Option(help="Record sizes in MiB, comma separated.")] = "2,32",
    rate: Annotated[float, typer.Option(help="Bytes written per second, in MB/s.")] = 200.0,
    settings: Annotated[
        str,
        typer.Option(
            help="Settings, comma separated, each optionally with /process (the loop in a "
            "process of its own: CPU shared, GIL not): none, fs, kvtier, kvtier-batch, "
            "kvtier-pywrite, kvtier-nohash, kvtier-noindex, kvtier-nopayload."
        ),
    ] = "none,fs,fs/process,kvtier,kvtier/process,kvtier-noindex,kvtier-nopayload",
    threads: Annotated[int, typer.Option(help="Writer threads.")] = 4,
    seconds: Annotated[float, typer.Option(help="Seconds per setting and round.")] = 3.0,
    rounds: Annotated[int, typer.Option(help="Rounds (every setting once each, in order).")] = 5,
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Folder for the records (default: temp).")
    ] = None,
    batch: Annotated[
        int, typer.Option(help="Records per put_many call of the kvtier-batch setting.")
    ] = 8,
) -> None:
    """What writes to disk cost an engine-like Python loop in the same process: vLLM's fs
    tier's way, kvtier's put (one at a time and in batches), and kvtier's put without parts
    of it (no engine).

    Example: python -m benchmarks write-cost --sizes 2,32 --rate 200 --rounds 5
    """
    from benchmarks import write_cost

    for size in (int(s) for s in sizes.split(",")):
        record_bytes = size << 20
        results = write_cost.run(
            settings.split(","),
            record_bytes,
            rate * 1e6,
            threads=threads,
            seconds=seconds,
            rounds=rounds,
            folder=folder,
            batch_records=batch,
        )
        typer.echo(write_cost.table(results, record_bytes, rate * 1e6))
        typer.echo("")


@app.command("handovers")
def bench_handovers(
    batches: Annotated[int, typer.Option(help="Batches counted.")] = 40,
    batch: Annotated[int, typer.Option(help="Records per batch.")] = 16,
    record_kib: Annotated[int, typer.Option(help="Record size in KiB.")] = 256,
    evicting: Annotated[
        bool, typer.Option(help="A full store: every batch evicts as many records as it adds.")
    ] = False,
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Folder for the store (default: temp).")
    ] = None,
    threads: Annotated[
        int, typer.Option(help="Write threads, one batch each per job, side by side.")
    ] = 1,
) -> None:
    """Every GIL re-acquisition of a write thread storing batches through the tier's path,
    counted with a perf uprobe and charged to the call it returned from (needs perf with
    uprobes: root).

    Example: python -m benchmarks handovers --batches 40 --evicting
    """
    from benchmarks import handovers

    try:
        account = handovers.run(batches, batch, record_kib, evicting, folder, threads)
    except RuntimeError as exc:  # no perf, or no right to probe: say the fix, no traceback
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(handovers.table(account))


@app.command("pool-on-disk")
def bench_pool_on_disk(
    folder: Annotated[Path, typer.Option("--dir", help="Folder for the pool file.")],
    disk_pool: Annotated[str, typer.Option(help="Size of the pool on disk.")] = "32GiB",
    ram_pool: Annotated[str, typer.Option(help="Size of the pool in /dev/shm.")] = "2GiB",
    prompts: Annotated[int, typer.Option(help="Distinct 1024-token prompts.")] = 120,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON report here.")] = None,
) -> None:
    """What a host pool costs in RAM (/dev/shm) against a sparse file (host_pool_dir).

    Runs one in-process engine per pool kind (tiny Llama). vLLM logs to stdout; the report is
    the last JSON printed.

    Example: python -m benchmarks pool-on-disk --dir /var/tmp/kvtier-pool-measure --out pool.json
    """
    from benchmarks import pool_on_disk
    from kvtier.errors import ConfigError
    from kvtier.units import parse_size

    try:
        for value, name in ((disk_pool, "--disk-pool"), (ram_pool, "--ram-pool")):
            parse_size(value, name)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from exc

    report = pool_on_disk.run(folder, disk_pool, ram_pool, prompts)
    typer.echo(pool_on_disk.write(report, out))


@app.command("publish")
def publish_reports(
    reports: Annotated[
        Path | None,
        typer.Option(help="Report folder (default: $KVTIER_REPORT_DIR or out/reports)."),
    ] = None,
    checkout: Annotated[
        Path | None, typer.Option(help="Source checkout whose docs/ to update.")
    ] = None,
) -> None:
    """Copy the reports of the last runs into docs/ (reliability.md, model-matrix.md).

    Test runs write their reports to the report folder only; this is the deliberate step that
    puts them in the tracked docs.

    Example: bash scripts/test.sh -m faults && python -m benchmarks publish
    """
    from tests.support.reports import checkout_dir, publish, report_dir

    found = False
    for doc, source in publish(reports or report_dir(), checkout or checkout_dir()):
        if source is None:
            typer.echo(f"{doc}: no report, left as it is")
        else:
            found = True
            typer.echo(f"{doc}: from {source}")
    if not found:
        raise typer.Exit(1)


@app.command("soak")
def soak(
    duration: Annotated[
        float, typer.Option(help="Seconds of load and faults, after start-up.")
    ] = 3600.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule and the load.")] = 0,
    out: Annotated[
        Path, typer.Option(help="Folder for events.jsonl, the report and server logs.")
    ] = Path("soak-out"),
    smollm: Annotated[
        bool | None,
        typer.Option(
            "--smollm/--no-smollm",
            help="One server serves SmolLM2 (default: on for runs of 10 minutes or more).",
        ),
    ] = None,
    short: Annotated[
        bool,
        typer.Option("--short", help="Two servers and a quicker fault pace (the CI soak)."),
    ] = False,
) -> None:
    """Real kvtier servers under seeded faults and a checked chat load, then a verdict.

    Root for the disk faults (tmpfs mounts); needs redis-server. Exits 1 when the verdict
    fails (see OUT/report.md).

    Example: python -m benchmarks soak --duration 3600 --seed 1 --out soak-out
    """
    from benchmarks.soak.runner import run

    use_smollm = smollm if smollm is not None else (duration >= 600 and not short)
    code = run(duration, seed, out, smollm=use_smollm, short=short)
    if code:
        raise typer.Exit(code)


GPU_STORE_DIR = Path("/var/tmp/kvtier-gpu-evidence")


@app.command("gpu-measure")
def gpu_measure(
    out: Annotated[Path, typer.Option(help="Raw results JSON (appended per section).")],
    folder: Annotated[
        Path, typer.Option("--dir", help="Store folder on the disk to measure.")
    ] = GPU_STORE_DIR,
    budget_s: Annotated[float, typer.Option(help="Stop starting new sections after this.")] = 420.0,
    reps: Annotated[int, typer.Option(help="Repeats per figure.")] = 3,
) -> None:
    """Raw GPU evidence on this CUDA machine: prefill, host->GPU copies, disk and cuFile reads.

    Needs torch with CUDA; each section records its own error and the run goes on.

    Example: python -m benchmarks gpu-measure --out raw.json --reps 5 --budget-s 420
    """
    from benchmarks.gpu_measure import measure_all

    measure_all(out, folder, budget_s, reps)


@app.command("gpu-evidence")
def gpu_evidence(
    raw: Annotated[Path, typer.Argument(help="gpu-measure's JSON, or a saved report's.")],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write raw + derived results here.")
    ] = None,
    md: Annotated[Path | None, typer.Option(help="Write the tables here too.")] = None,
    safety_factors: Annotated[
        str | None,
        typer.Option(
            help="Only the picks' outcome under each of these safety factors, comma separated "
            "(e.g. 1,1.05,1.1,1.2); nothing written."
        ),
    ] = None,
) -> None:
    """Feed gpu-measure's figures to kvtier.policy and tabulate its picks (no GPU needed).

    Example: python -m benchmarks gpu-evidence raw.json --json docs/bench/gpu-evidence.json
    --md docs/bench/gpu-evidence.md
    """
    from benchmarks.gpu_evidence import report

    factors = [float(f) for f in safety_factors.split(",")] if safety_factors else None
    typer.echo(report(raw, json_path, md, factors), nl=False)


@app.command("soak-report")
def soak_report(
    events: Annotated[Path, typer.Argument(help="The soak's events.jsonl.")],
    out: Annotated[Path, typer.Argument(help="Folder for report.md, report.json, soak.png.")],
) -> None:
    """Render the soak's report and verdict again from its event log (exit 1 if it failed).

    Example: python -m benchmarks soak-report soak-out/events.jsonl soak-out
    """
    from benchmarks.soak.report import write_report

    verdict = write_report(events, out)
    for failure in verdict.failures:
        typer.echo(f"FAIL {failure}", err=True)
    typer.echo(f"{'passed' if verdict.passed else 'FAILED'}: {out / 'report.md'}")
    if not verdict.passed:
        raise typer.Exit(1)
