"""``kvtier`` command: serve a model with offloading, run the demo, benchmarks and probes."""

import inspect
import os
import shlex
from pathlib import Path
from typing import Annotated

import typer

from kvtier.errors import ConfigError
from kvtier.extras import MissingExtraError, require
from kvtier.transfer_config import DEFAULT_HOST_POOL, kv_transfer_config

#: ``kvtier serve``'s options that go to ``kv_transfer_config`` unchanged (all of its
#: arguments but ``extra`` and ``platform``: ``serve`` runs the installed vLLM build, whose
#: platform ``kv_transfer_config`` reads itself).
TRANSFER_OPTIONS = [
    name
    for name in inspect.signature(kv_transfer_config).parameters
    if name not in ("extra", "platform")
]

app = typer.Typer(
    help="Tiered, persistent, verified KV-cache offloading for vLLM.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(message if message.startswith("kvtier: ") else f"kvtier: {message}", err=True)
    raise typer.Exit(code)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="Model folder or name, as for vllm serve.")],
    host_pool: Annotated[
        str, typer.Option(help="Host-RAM pool size, e.g. 4GiB.")
    ] = DEFAULT_HOST_POOL,
    disk_dir: Annotated[
        Path | None, typer.Option(help="Folder of the persistent disk tier (off when unset).")
    ] = None,
    disk_capacity: Annotated[
        str | None,
        typer.Option(help="Disk tier cap, e.g. 64GiB (default: 1/4 of its file system, <=256GiB)."),
    ] = None,
    disk_threads: Annotated[int, typer.Option(help="Disk tier I/O threads per direction.")] = 4,
    disk_tier: Annotated[
        str, typer.Option(help="kvtier (verified, bounded) or fs (vLLM's stock tier).")
    ] = "kvtier",
    fsync: Annotated[str, typer.Option(help="never, data or always.")] = "never",
    host_pool_dir: Annotated[
        Path | None,
        typer.Option(help="Back the host pool with a sparse file in this local folder, not RAM."),
    ] = None,
    allow_small_tiers: Annotated[
        bool,
        typer.Option(
            "--allow-small-tiers", help="Warn instead of refusing a tier no larger than the engine."
        ),
    ] = False,
    restore_decision: Annotated[
        bool,
        typer.Option(
            "--restore-decision/--no-restore-decision",
            help="Restore a hit only when faster than recomputing it, and skip a disk's "
            "stores while no restore from it could pay (default on).",
        ),
    ] = True,
    shared: Annotated[
        str | None,
        typer.Option(
            help="Shared tier URL: redis://HOST:PORT, rediss://HOST:PORT (TLS) or "
            "redis+cluster://HOST:PORT[,HOST:PORT]. Password: env KVTIER_SHARED_PASSWORD."
        ),
    ] = None,
    shared_username: Annotated[
        str | None, typer.Option(help="ACL user of the shared tier.")
    ] = None,
    shared_tls_ca_file: Annotated[
        Path | None, typer.Option(help="CA certificates of the shared tier's server (PEM).")
    ] = None,
    shared_tls_cert_file: Annotated[
        Path | None, typer.Option(help="Client certificate for the shared tier (PEM).")
    ] = None,
    shared_tls_key_file: Annotated[
        Path | None, typer.Option(help="Key of the client certificate (PEM).")
    ] = None,
    encryption_key_files: Annotated[
        list[Path] | None,
        typer.Option(
            "--encryption-key-file",
            help="Encrypt the disk and shared tiers with the master key in this 0600 file; "
            "repeat after a rotation, the current key first.",
        ),
    ] = None,
    encryption_key_env: Annotated[
        bool,
        typer.Option(
            "--encryption-key-env", help="Encrypt with the master keys in env KVTIER_MASTER_KEY."
        ),
    ] = False,
    require_cache_salt: Annotated[
        bool,
        typer.Option(
            "--require-cache-salt",
            help="Keep requests without a cache_salt off the disk and shared tiers (with "
            "encryption).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the command instead of running it.")
    ] = False,
) -> None:
    """Start vLLM's OpenAI-compatible server with kvtier offloading.

    Arguments after the model that kvtier does not know go to vLLM unchanged. The installed
    vLLM build decides who runs the host pool: vLLM's own on a CUDA build, kvtier's on the CPU
    build; where its block hashes need it, PYTHONHASHSEED is set to 0 unless already set.

    Example: kvtier serve ./SmolLM2 --disk-dir /var/cache/kvtier --max-model-len 8192
    """
    from kvtier.launch import serve_command, serve_env
    from kvtier.vllm import release

    try:
        if not dry_run:
            require("engine", "kvtier serve")
        if shared is not None:
            require("shared", "the shared tier (--shared)")
        if encryption_key_files or encryption_key_env:
            require("encryption", "encryption at rest (--encryption-key-file/-env)")
        # Every option but the model and --dry-run is kv_transfer_config's argument of the
        # same name (tests/cli/test_cli.py pins the two lists together).
        given = locals()
        config = kv_transfer_config(**{name: given[name] for name in TRANSFER_OPTIONS})
        argv = serve_command(model, config, list(ctx.args))
    except ConfigError as exc:
        _fail(str(exc))
    if dry_run:
        typer.echo(shlex.join(argv))
        return
    os.execve(argv[0], argv, serve_env(hash_seed=release.needs_hash_seed()))


@app.command()
def demo(
    tokens: Annotated[int, typer.Option(help="Prompt length in tokens.")] = 4000,
    port: Annotated[
        int,
        typer.Option(help="Port of the demo server (loopback only); the second server: PORT+1."),
    ] = 8765,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the disk tiers and logs, kept (unset: a temporary one, removed)."
        ),
    ] = None,
    shared: Annotated[
        bool,
        typer.Option(
            "--shared",
            help="Also restore on a second server from a shared tier on a throw-away Redis "
            "server (needs redis-server or valkey-server; one more server start).",
        ),
    ] = False,
) -> None:
    """Serve SmolLM2-135M with kvtier and show cold vs restored time to first token.

    Sends a long prompt cold, evicts it from the engine (prefix-cache reset), sends it again
    (host-pool restore), restarts the server and sends it once more (disk restore). With
    --shared, both write through to a throw-away Redis server on loopback, and a second server
    with an empty disk folder serves the prompt from it. Every server is stopped at the end.

    Example: kvtier demo --tokens 4000 --shared
    """
    require("bench", "kvtier demo")
    if shared:
        require("shared", "kvtier demo --shared")
    from kvtier.demo import run_demo

    raise typer.Exit(run_demo(tokens=tokens, port=port, work_dir=work_dir, shared=shared))


@app.command()
def size(
    model_dir: Annotated[Path, typer.Argument(help="Local model folder (its config.json).")],
    host_pool: Annotated[
        str, typer.Option(help="Host-RAM pool size, e.g. 4GiB.")
    ] = DEFAULT_HOST_POOL,
    disk_capacity: Annotated[
        str | None, typer.Option(help="Disk tier cap, e.g. 64GiB (no disk tier when unset).")
    ] = None,
    engine_kv: Annotated[
        str | None,
        typer.Option(help="Engine KV pool, e.g. 4GiB (default: VLLM_CPU_KVCACHE_SPACE GiB)."),
    ] = None,
    kv_dtype: Annotated[
        str, typer.Option(help="KV dtype: auto (the model's), float32, bfloat16, float16, fp8.")
    ] = "auto",
    block_size: Annotated[int, typer.Option(help="Engine block size in tokens.")] = 128,
    blocks_per_chunk: Annotated[int, typer.Option(help="Engine blocks per host-pool row.")] = 1,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """Show how many tokens each tier holds for a model, without starting an engine.

    Flags any tier no larger than the engine's KV pool: both are LRU over the same blocks,
    so such a tier never serves a restore, and kvtier refuses to start with it (exit code 2
    here). Sizes are exact for the host pool rows and disk records.

    Example: kvtier size ./SmolLM2 --engine-kv 1GiB --host-pool 2GiB --disk-capacity 64GiB
    """
    from rich.console import Console

    from kvtier.cli.size import default_engine_kv, plan, render, render_json

    engine = engine_kv or default_engine_kv()
    if engine is None:
        _fail("give --engine-kv (the engine's KV pool, VLLM_CPU_KVCACHE_SPACE), e.g. 4GiB")
    try:
        layout, capacities, verdict = plan(
            str(model_dir),
            engine,
            host_pool,
            disk_capacity,
            kv_dtype,
            block_size,
            blocks_per_chunk,
        )
    except ConfigError as exc:
        _fail(str(exc))
    if json_output:
        typer.echo(render_json(layout, capacities, verdict))
    else:
        render(layout, capacities, verdict, Console(soft_wrap=False))
    for note in verdict.notes:
        typer.echo(f"note: {note}", err=True)
    for trap in verdict.traps:
        typer.echo(f"kvtier would refuse to start: {trap}", err=True)
    if verdict.traps:
        raise typer.Exit(2)


def _register_subcommands() -> None:
    from kvtier.cli.bench import bench_app, probe_app
    from kvtier.cli.ops import register as register_ops
    from kvtier.cli.stats import register as register_stats

    app.add_typer(bench_app, name="bench")
    app.add_typer(probe_app, name="probe")
    register_ops(app)
    register_stats(app)


_register_subcommands()


def main() -> None:
    """The console script: the app, with a missing optional dependency reported in one line
    (the extra to install) wherever in a command it is found, instead of a traceback."""
    try:
        app()
    except MissingExtraError as exc:
        typer.echo(str(exc), err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
