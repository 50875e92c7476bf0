"""``kvtier bench`` and ``kvtier probe``: benchmarks, probes and the reports they publish.

Every command imports ``kvtier.devtools`` lazily, inside its body.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

bench_app = typer.Typer(
    help="Benchmarks: figures measured side by side in one run.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
probe_app = typer.Typer(
    help="Correctness probes against a real engine.", no_args_is_help=True, rich_markup_mode=None
)
err = Console(stderr=True)

OutOption = Annotated[Path, typer.Option(help="Folder for tables (.md), raw data (.json), plots.")]
ModelOption = Annotated[
    str | None, typer.Option(help="HF model folder (default: SmolLM2-135M-Instruct from PyPI).")
]


@contextmanager
def _progress(title: str) -> Iterator[Callable[[str], None]]:
    """A spinner with elapsed time; each progress line is printed above it (stderr)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(title)

        def report(line: str) -> None:
            progress.console.print(line)
            progress.update(task, description=f"{title}: {line.strip()[:60]}")

        yield report


def _model(model: str | None) -> str:
    from kvtier.devtools.bench.common import default_model

    return model or default_model()


def _print_result(out: Path, stem: str) -> None:
    typer.echo((out / f"{stem}.md").read_text())
    typer.echo(f"raw data and plots: {out}/{stem}.*")


@bench_app.command("ttft")
def bench_ttft(
    out: OutOption = Path("bench-out"),
    model: ModelOption = None,
    lengths: Annotated[
        str, typer.Option(help="Prompt lengths, comma separated.")
    ] = "2048,4096,8000",
    reps: Annotated[int, typer.Option(help="Distinct prompts per length (>= 3 for medians).")] = 3,
    shared: Annotated[
        str,
        typer.Option(
            help="Also restore from the shared tier in a fresh process with an empty disk: "
            "'standalone', 'cluster' or both, comma separated (throw-away loopback servers; "
            "needs redis-server). Empty: no shared tier."
        ),
    ] = "",
    restore_decision: Annotated[
        bool, typer.Option(help="kvtier's restore-or-recompute decision (off: restore every hit).")
    ] = True,
    compare_decision: Annotated[
        bool,
        typer.Option(
            help="Run every kvtier reader twice, decision on and off, side by side (adds "
            "'decision off' rows and on/off ratios)."
        ),
    ] = False,
) -> None:
    """Cold prefill vs host-pool restore vs disk restore (kvtier and stock fs), one run.

    Example: kvtier bench ttft --lengths 2048,4096,8000 --reps 3 --shared standalone,cluster
    --compare-decision
    """
    from kvtier.devtools.bench import ttft

    topologies = [t.strip() for t in shared.split(",") if t.strip()]
    if set(topologies) - set(ttft.TOPOLOGIES):
        raise typer.BadParameter(f"--shared takes {', '.join(ttft.TOPOLOGIES)}; got {shared!r}")
    with _progress("ttft") as report:
        ttft.run(
            _model(model),
            [int(x) for x in lengths.split(",")],
            reps,
            out,
            progress=report,
            shared=topologies,
            decisions=(True, False) if compare_decision else (restore_decision,),
        )
    _print_result(out, "ttft")


@bench_app.command("decision")
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

    Example: kvtier bench decision --lengths 2048,8000 --engines 3
    """
    from kvtier.devtools.bench import decision_abba

    if same_engine:
        with _progress("decision") as report:
            decision_abba.run_same_engine(
                _model(model),
                [int(x) for x in lengths.split(",")],
                reps,
                out,
                batch=batch,
                progress=report,
            )
        _print_result(out, "decision-same-engine")
        return
    with _progress("decision") as report:
        decision_abba.run(
            _model(model),
            [int(x) for x in lengths.split(",")],
            reps,
            out,
            engines_per_setting=engines,
            progress=report,
        )
    _print_result(out, "decision")


@bench_app.command("slow-tier")
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

    Example: kvtier bench slow-tier --out slowtier-out --lengths 2048,8000
    """
    from kvtier.devtools.bench import slowtier

    if model is None:
        from kvtier.devtools.models import tiny_llama

        model = str(tiny_llama())
    with _progress("slow-tier") as report:
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
    _print_result(out, "slowtier")


@bench_app.command("concurrent")
def bench_concurrent(
    out: OutOption = Path("bench-out"),
    model: ModelOption = None,
    prompt_len: Annotated[int, typer.Option(help="Tokens per prompt.")] = 2048,
    counts: Annotated[str, typer.Option(help="Values of N, comma separated.")] = "1,2,4,8",
    source: Annotated[
        str,
        typer.Option(
            help="Where restores come from: 'disk' (kvtier's disk tier, same engine), "
            "'standalone' or 'cluster' (the shared tier on a throw-away loopback server, "
            "restored by a fresh engine with an empty disk folder; needs redis-server)."
        ),
    ] = "disk",
    compare_decision: Annotated[
        bool,
        typer.Option(
            help="Disk source: the run once with the restore decision on and once off, each "
            "in its own engine, side by side (default: off only, every hit restored)."
        ),
    ] = False,
) -> None:
    """N concurrent restores vs N concurrent cold prefills of the same size.

    Example: kvtier bench concurrent --prompt-len 2048 --counts 1,2,4,8 --source standalone
    """
    from kvtier.devtools.bench import concurrent

    if source not in concurrent.SOURCES:
        raise typer.BadParameter(f"--source takes {', '.join(concurrent.SOURCES)}; got {source!r}")
    with _progress("concurrent") as report:
        concurrent.run(
            _model(model),
            prompt_len,
            [int(x) for x in counts.split(",")],
            out,
            progress=report,
            source=source,
            decisions=(True, False) if compare_decision else (False,),
        )
    _print_result(out, "concurrent" if source == "disk" else f"concurrent-{source}")


@bench_app.command("overhead")
def bench_overhead(
    out: OutOption = Path("bench-out"),
    model: ModelOption = None,
    requests: Annotated[int, typer.Option(help="Requests of the throughput batch.")] = 16,
    latency_requests: Annotated[
        int, typer.Option(help="Requests sent one at a time for TTFT and TPOT.")
    ] = 6,
    passes: Annotated[int, typer.Option(help="Passes per engine (alternating).")] = 5,
    compare_decision: Annotated[
        bool,
        typer.Option(help="A third engine, kvtier on with the restore decision off, side by side."),
    ] = False,
    same_engine: Annotated[
        bool,
        typer.Option(
            "--same-engine",
            help="One engine: requests kvtier stores vs requests that store nothing.",
        ),
    ] = False,
    pairs: Annotated[int, typer.Option(help="Request pairs (--same-engine).")] = 12,
    disk_dir: Annotated[
        Path | None, typer.Option(help="The disk tier's folder (--same-engine).")
    ] = None,
) -> None:
    """kvtier on vs off over the same zero-reuse request set: TTFT, TPOT, throughput (or,
    with --same-engine, the store path's cost inside one engine).

    Example: kvtier bench overhead --passes 5
    """
    from kvtier.devtools.bench import overhead

    if same_engine:
        with _progress("overhead") as report:
            overhead.run_stores_same_engine(
                _model(model), out, pairs=pairs, disk_dir=disk_dir, progress=report
            )
        _print_result(out, "overhead-stores")
        return
    with _progress("overhead") as report:
        overhead.run(
            _model(model),
            out,
            requests=requests,
            latency_requests=latency_requests,
            passes=passes,
            progress=report,
            compare_decision=compare_decision,
        )
    _print_result(out, "overhead")


@bench_app.command("bandwidth")
def bench_bandwidth(
    out: OutOption = Path("bench-out"),
    reps: Annotated[int, typer.Option(help="Passes.")] = 3,
) -> None:
    """Restore data path GB/s next to plain sequential reads and memcpy (no engine).

    Example: kvtier bench bandwidth --reps 3
    """
    from kvtier.devtools.bench import bandwidth

    with _progress("bandwidth") as report:
        bandwidth.run(out, reps=reps, progress=report)
    _print_result(out, "bandwidth")


@bench_app.command("store")
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
) -> None:
    """DiskStore throughput, latency and index figures next to plain file I/O (no engine).

    Example: kvtier bench store --json /tmp/store_bench.json
    """
    from kvtier.devtools.bench import store_bench

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
    )


@bench_app.command("checksum")
def bench_checksum(
    repeats: Annotated[int, typer.Option(help="Timed runs per cell.")] = 7,
) -> None:
    """GB/s of candidate payload checksums over realistic block sizes (no engine).

    Example: kvtier bench checksum --repeats 7
    """
    from kvtier.devtools.bench import checksum_bench

    typer.echo(checksum_bench.run(repeats))


@bench_app.command("pool-on-disk")
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

    Example: kvtier bench pool-on-disk --dir /var/tmp/kvtier-pool-measure --out pool.json
    """
    from kvtier.devtools.bench import pool_on_disk
    from kvtier.errors import ConfigError
    from kvtier.units import parse_size

    try:
        for value, name in ((disk_pool, "--disk-pool"), (ram_pool, "--ram-pool")):
            parse_size(value, name)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from exc

    report = pool_on_disk.run(folder, disk_pool, ram_pool, prompts)
    typer.echo(pool_on_disk.write(report, out))


@bench_app.command("shared")
def bench_shared(
    out: OutOption = Path("shared-bench"),
    standalone_url: Annotated[
        str | None, typer.Option(help="A standalone server (default: a throw-away one).")
    ] = None,
    cluster_url: Annotated[
        str | None, typer.Option(help="A Cluster node (default: a throw-away 3-master one).")
    ] = None,
    passes: Annotated[int, typer.Option(help="Passes per case.")] = 5,
) -> None:
    """Shared tier: SharedStore put/get_into next to redis-py's plain SET/GET (needs redis).

    Example: kvtier bench shared --out /tmp/shared-bench --passes 7
    """
    from kvtier.devtools.bench import shared_bench

    typer.echo(
        shared_bench.report(shared_bench.run(out, standalone_url, cluster_url, passes=passes))
    )


@bench_app.command("docs")
def bench_docs(
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

    Example: bash scripts/test.sh -m faults && kvtier bench docs
    """
    from kvtier.devtools.reports import checkout_dir, publish, report_dir

    found = False
    for doc, source in publish(reports or report_dir(), checkout or checkout_dir()):
        if source is None:
            typer.echo(f"{doc}: no report, left as it is")
        else:
            found = True
            typer.echo(f"{doc}: from {source}")
    if not found:
        raise typer.Exit(1)


@probe_app.command("needles")
def probe_needles(
    out: OutOption = Path("probe-out"),
    model: ModelOption = None,
    sessions: Annotated[int, typer.Option(help="Sessions (five needles each).")] = 6,
    session_tokens: Annotated[int, typer.Option(help="Approximate tokens per session.")] = 1200,
    wave: Annotated[int, typer.Option(help="Sessions restored concurrently per wave.")] = 3,
) -> None:
    """Needles at 10/30/50/70/90 % depth in many sessions, evicted, restored in waves.

    Exit code 0 when every needle the model-only baseline finds is found after restore, 1
    otherwise.

    Example: kvtier probe needles --sessions 6 --wave 3
    """
    from kvtier.devtools.probe import needles

    with _progress("needles") as report:
        result = needles.run(
            _model(model),
            out,
            sessions=sessions,
            session_tokens=session_tokens,
            wave=wave,
            progress=report,
        )
    _print_result(out, "needles")
    raise typer.Exit(0 if result["passed"] else 1)
