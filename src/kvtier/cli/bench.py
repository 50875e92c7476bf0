"""``kvtier bench`` and ``kvtier probe``: what a user measures on their own deployment.

The benchmarks here answer a user's questions (restore time to first token, concurrent
restores, kvtier's overhead, the shared tier's throughput); the project's own design
experiments live in the source checkout's ``benchmarks/`` (``python -m benchmarks``). Every
command imports ``kvtier.bench`` / ``kvtier.probe`` lazily, inside its body, so ``kvtier ls``
and the other operator commands load none of it.
"""

from pathlib import Path
from typing import Annotated

import typer

from kvtier.extras import require

bench_app = typer.Typer(
    help="Benchmarks: figures measured side by side in one run.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
probe_app = typer.Typer(
    help="Correctness probes against a real engine.", no_args_is_help=True, rich_markup_mode=None
)

OutOption = Annotated[Path, typer.Option(help="Folder for tables (.md), raw data (.json), plots.")]
ModelOption = Annotated[
    str | None, typer.Option(help="HF model folder (default: SmolLM2-135M-Instruct from PyPI).")
]


def _model(model: str | None) -> str:
    from kvtier.bench.common import default_model

    return model or default_model()


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
    require("bench", "kvtier bench ttft")
    if shared:
        require("shared", "kvtier bench ttft --shared")
    from kvtier.bench import ttft
    from kvtier.bench.console import print_result, progress

    topologies = [t.strip() for t in shared.split(",") if t.strip()]
    if set(topologies) - set(ttft.TOPOLOGIES):
        raise typer.BadParameter(f"--shared takes {', '.join(ttft.TOPOLOGIES)}; got {shared!r}")
    with progress("ttft") as report:
        ttft.run(
            _model(model),
            [int(x) for x in lengths.split(",")],
            reps,
            out,
            progress=report,
            shared=topologies,
            decisions=(True, False) if compare_decision else (restore_decision,),
        )
    print_result(out, "ttft")


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
    require("bench", "kvtier bench concurrent")
    if source != "disk":
        require("shared", f"kvtier bench concurrent --source {source}")
    from kvtier.bench import concurrent
    from kvtier.bench.console import print_result, progress

    if source not in concurrent.SOURCES:
        raise typer.BadParameter(f"--source takes {', '.join(concurrent.SOURCES)}; got {source!r}")
    with progress("concurrent") as report:
        concurrent.run(
            _model(model),
            prompt_len,
            [int(x) for x in counts.split(",")],
            out,
            progress=report,
            source=source,
            decisions=(True, False) if compare_decision else (False,),
        )
    print_result(out, "concurrent" if source == "disk" else f"concurrent-{source}")


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
    require("bench", "kvtier bench overhead")
    from kvtier.bench import overhead
    from kvtier.bench.console import print_result, progress

    if same_engine:
        with progress("overhead") as report:
            overhead.run_stores_same_engine(
                _model(model), out, pairs=pairs, disk_dir=disk_dir, progress=report
            )
        print_result(out, "overhead-stores")
        return
    with progress("overhead") as report:
        overhead.run(
            _model(model),
            out,
            requests=requests,
            latency_requests=latency_requests,
            passes=passes,
            progress=report,
            compare_decision=compare_decision,
        )
    print_result(out, "overhead")


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
    require("shared", "kvtier bench shared")
    from kvtier.bench import shared_bench

    typer.echo(
        shared_bench.report(shared_bench.run(out, standalone_url, cluster_url, passes=passes))
    )


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
    require("bench", "kvtier probe needles")
    from kvtier.bench.console import print_result, progress
    from kvtier.probe import needles

    with progress("needles") as report:
        result = needles.run(
            _model(model),
            out,
            sessions=sessions,
            session_tokens=session_tokens,
            wave=wave,
            progress=report,
        )
    print_result(out, "needles")
    raise typer.Exit(0 if result["passed"] else 1)
