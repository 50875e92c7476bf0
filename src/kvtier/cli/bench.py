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

from kvtier.errors import ConfigError
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


@bench_app.command("workload")
def bench_workload(
    url: Annotated[
        str, typer.Option(help="The OpenAI-compatible server, http://HOST:PORT (or .../v1).")
    ] = "http://127.0.0.1:8000",
    workload: Annotated[
        str,
        typer.Option(
            help="chat (users x rounds, a shared system prompt, growing histories), documents "
            "(documents x questions), no-reuse (chat's prompt lengths, every prompt unique) or "
            "restart (chat with --restart-command run between two rounds)."
        ),
    ] = "chat",
    users: Annotated[int, typer.Option(help="chat, no-reuse, restart: users.")] = 8,
    rounds: Annotated[int, typer.Option(help="chat, no-reuse, restart: rounds per user.")] = 4,
    system_tokens: Annotated[
        int, typer.Option(help="chat, restart: tokens of the system prompt all users share.")
    ] = 500,
    question_tokens: Annotated[
        int, typer.Option(help="Tokens of each user message (chat) or question (documents).")
    ] = 100,
    answer_tokens: Annotated[
        int, typer.Option(help="max_tokens of every request (the answer's length).")
    ] = 50,
    documents: Annotated[int, typer.Option(help="documents: how many documents.")] = 8,
    document_tokens: Annotated[int, typer.Option(help="documents: tokens per document.")] = 2000,
    questions: Annotated[int, typer.Option(help="documents: questions per document.")] = 2,
    order: Annotated[
        str,
        typer.Option(
            help="documents: tile (every document once, then again: the longest reuse "
            "distance) or random (all questions shuffled by the seed)."
        ),
    ] = "tile",
    pool_multiple: Annotated[
        float | None,
        typer.Option(
            help="Set --users (or --documents) so the working set is this multiple of the "
            "engine's own KV cache, read from the server's vllm:cache_config_info."
        ),
    ] = None,
    qps: Annotated[
        float,
        typer.Option(
            help="Poisson arrivals at this many requests per second (a user's next round "
            "waits for its previous answer too); 0: all at once, paced by --concurrency."
        ),
    ] = 0.0,
    concurrency: Annotated[
        int, typer.Option(help="At most this many requests in flight; 0: no cap.")
    ] = 0,
    seed: Annotated[
        int, typer.Option(help="Seed of every text, the order and the arrival times.")
    ] = 0,
    restart_command: Annotated[
        str | None,
        typer.Option(
            help="restart: shell command run once every request of the rounds before "
            "--restart-round is answered (e.g. a server restart); it may return before the "
            "server is up: the driver then waits for /health."
        ),
    ] = None,
    restart_round: Annotated[
        int | None,
        typer.Option(help="restart: the first round after the command, 1-based (default: middle)."),
    ] = None,
    ready_timeout_s: Annotated[
        float, typer.Option(help="restart: longest wait for /health after the command.")
    ] = 600.0,
    model: Annotated[
        str | None, typer.Option(help="Model name to request (default: the server's first).")
    ] = None,
    endpoint: Annotated[
        str,
        typer.Option(
            help="chat (/v1/chat/completions, the model's chat template) or completions "
            "(/v1/completions, the chat as plain text: for models without a template)."
        ),
    ] = "chat",
    ignore_eos: Annotated[
        bool,
        typer.Option(
            help="Send vLLM's ignore_eos so every answer is --answer-tokens long (turn off for "
            "servers that refuse unknown fields)."
        ),
    ] = True,
    timeout_s: Annotated[
        float, typer.Option(help="Longest a request may take, to its last token.")
    ] = 600.0,
    api_key_env: Annotated[
        str,
        typer.Option(help="Environment variable holding the API key (sent as a bearer token)."),
    ] = "OPENAI_API_KEY",
    label: Annotated[
        str,
        typer.Option(
            help="This server configuration's name in the table and plot (letters, digits, "
            "'.', '_', '-'): run once per configuration into one --out to compare them."
        ),
    ] = "run",
    out: OutOption = Path("bench-out"),
    json_output: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the run's settings and figures as JSON instead of the tables."
        ),
    ] = False,
) -> None:
    """Serving workloads against any OpenAI-compatible server: TTFT, ITL, throughput, tokens
    by source.

    Prints a table of every configuration run with the same workload in --out, and writes
    workload-WORKLOAD-LABEL.json (every request), workload-WORKLOAD.md (the tables) and
    workload-WORKLOAD.png (TTFT per round, one line per configuration).

    Example: kvtier bench workload --url http://127.0.0.1:8000 --workload chat --users 16
    --rounds 4 --qps 2 --label kvtier
    """
    import json
    import re

    require("bench", "kvtier bench workload", ("httpx", "matplotlib"))
    from kvtier.bench.console import err
    from kvtier.bench.workload import output, plan
    from kvtier.bench.workload.drive import CommandFailed, Sending, api_key, drive
    from kvtier.bench.workload.runner import ServerNotReady

    if not re.fullmatch(r"[A-Za-z0-9._-]+", label):
        raise typer.BadParameter(f"--label {label!r}: use letters, digits, '.', '_', '-'")
    if (workload == "restart") != (restart_command is not None):
        raise typer.BadParameter("--restart-command goes with --workload restart, and only there")
    if restart_round is not None and not 2 <= restart_round <= rounds:
        raise typer.BadParameter(
            f"--restart-round {restart_round}: give a round from 2 to {rounds}"
        )
    if concurrency < 0:
        raise typer.BadParameter(f"--concurrency {concurrency}: give 0 (no cap) or more")
    if endpoint not in ("chat", "completions"):
        raise typer.BadParameter(f"--endpoint takes chat or completions; got {endpoint!r}")
    try:
        shape = plan.Shape(
            workload=workload,
            users=users,
            rounds=rounds,
            system_tokens=system_tokens,
            question_tokens=question_tokens,
            answer_tokens=answer_tokens,
            documents=documents,
            document_tokens=document_tokens,
            questions=questions,
            order=order,
            seed=seed,
            restart_round=None if restart_round is None else restart_round - 1,
        )
        if qps < 0:
            raise ValueError(f"qps={qps}: give a rate >= 0")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    sending = Sending(
        url=url,
        model=model,
        endpoint=endpoint,
        qps=qps,
        concurrency=concurrency,
        ignore_eos=ignore_eos,
        label=label,
        out=out,
        timeout_s=timeout_s,
        ready_timeout_s=ready_timeout_s,
        restart_command=restart_command,
        pool_multiple=pool_multiple,
        api_key=api_key(api_key_env),
    )

    def note(line: str) -> None:
        err.print(line, markup=False, highlight=False)

    import asyncio

    import httpx

    try:
        report = asyncio.run(drive(shape, sending, note))
    except httpx.HTTPError as exc:
        note(f"kvtier bench workload: cannot read the server at {url}: {exc}")
        raise typer.Exit(3) from None
    except (CommandFailed, ServerNotReady) as exc:
        note(f"kvtier bench workload: {exc}")
        raise typer.Exit(1) from None
    except ConfigError as exc:
        note(str(exc))
        raise typer.Exit(2) from None
    files = output.publish(out, report, note, print_tables=not json_output)
    if json_output:
        print(json.dumps({"config": report["config"], "summary": report["summary"]}, indent=1))
    note("raw data, table and plot: " + ", ".join(str(p) for p in files))
    if report["summary"]["failed"]:
        note(f"{report['summary']['failed']} of {report['summary']['requests']} requests failed")
        raise typer.Exit(1)
