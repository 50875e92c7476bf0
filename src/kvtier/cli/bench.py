"""``kvtier bench`` and ``kvtier probe``: benchmarks and probes that drive real engines."""

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
) -> None:
    """Cold prefill vs host-pool restore vs disk restore (kvtier and stock fs), one run.

    Example: kvtier bench ttft --lengths 2048,4096,8000 --reps 3
    """
    from kvtier.devtools.bench import ttft

    with _progress("ttft") as report:
        ttft.run(_model(model), [int(x) for x in lengths.split(",")], reps, out, progress=report)
    _print_result(out, "ttft")


@bench_app.command("concurrent")
def bench_concurrent(
    out: OutOption = Path("bench-out"),
    model: ModelOption = None,
    prompt_len: Annotated[int, typer.Option(help="Tokens per prompt.")] = 2048,
    counts: Annotated[str, typer.Option(help="Values of N, comma separated.")] = "1,2,4,8",
) -> None:
    """N concurrent disk restores vs N concurrent cold prefills of the same size.

    Example: kvtier bench concurrent --prompt-len 2048 --counts 1,2,4,8
    """
    from kvtier.devtools.bench import concurrent

    with _progress("concurrent") as report:
        concurrent.run(
            _model(model), prompt_len, [int(x) for x in counts.split(",")], out, progress=report
        )
    _print_result(out, "concurrent")


@bench_app.command("overhead")
def bench_overhead(
    out: OutOption = Path("bench-out"),
    model: ModelOption = None,
    requests: Annotated[int, typer.Option(help="Requests of the throughput batch.")] = 16,
    latency_requests: Annotated[
        int, typer.Option(help="Requests sent one at a time for TTFT and TPOT.")
    ] = 6,
    passes: Annotated[int, typer.Option(help="Passes per engine (alternating).")] = 5,
) -> None:
    """kvtier on vs off over the same zero-reuse request set: TTFT, TPOT, throughput.

    Example: kvtier bench overhead --passes 5
    """
    from kvtier.devtools.bench import overhead

    with _progress("overhead") as report:
        overhead.run(
            _model(model),
            out,
            requests=requests,
            latency_requests=latency_requests,
            passes=passes,
            progress=report,
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
