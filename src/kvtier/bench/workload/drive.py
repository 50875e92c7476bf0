"""What ``kvtier bench workload`` does: size the workload, send it, summarize, publish."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvtier
from kvtier.bench.report import environment_line
from kvtier.bench.workload import metrics, plan, results, runner
from kvtier.bench.workload.client import OpenAIClient
from kvtier.errors import ConfigError


@dataclass(frozen=True)
class Sending:
    """How a workload is sent, and where its results go."""

    url: str  # the server, http://HOST:PORT (with or without /v1)
    model: str | None = None  # None: the first model the server lists
    endpoint: str = "chat"  # chat or completions
    qps: float = 0.0  # Poisson arrival rate; 0: every request arrives at once
    concurrency: int = 0  # cap on requests in flight; 0: none
    ignore_eos: bool = True  # every answer exactly answer_tokens long (vLLM's extension)
    label: str = "run"  # this configuration's name in tables and plots
    out: Path = Path("bench-out")
    timeout_s: float = 600.0  # one request, sent to its last token
    ready_timeout_s: float = 600.0  # the server's /health after the command between rounds
    restart_command: str | None = None  # shell command between rounds (restart workload)
    pool_multiple: float | None = None  # size users/documents to this multiple of the KV cache
    api_key: str | None = dataclasses.field(default=None, repr=False)


class CommandFailed(RuntimeError):
    """The command between rounds exited non-zero."""


def shell_hook(command: str) -> Callable[[], Awaitable[None]]:
    """Run ``command`` in a shell (its output goes to the driver's stderr); raise
    ``CommandFailed`` on a non-zero exit. The command may leave a server starting in the
    background: the runner then waits for its ``/health``."""

    try:
        err = sys.stderr.fileno()  # stdout carries the results' tables
    except (OSError, ValueError):  # a stderr that is no file (a test runner's): inherit
        err = None

    async def hook() -> None:
        proc = await asyncio.create_subprocess_shell(command, stdout=err, stderr=err)
        code = await proc.wait()
        if code != 0:
            raise CommandFailed(f"the command between rounds exited {code}: {command}")

    return hook


async def _sized(shape: plan.Shape, client: OpenAIClient, multiple: float) -> plan.Shape:
    pool = metrics.pool_tokens(await client.get_text("/metrics"))
    if pool is None:
        raise ConfigError(
            f"--pool-multiple: {client.url}/metrics gives no vllm:cache_config_info "
            "(num_gpu_blocks, block_size); give --users / --documents instead"
        )
    if shape.workload == "documents":
        count = plan.documents_for_pool(
            pool, multiple, shape.document_tokens, shape.question_tokens
        )
        return dataclasses.replace(shape, documents=count)
    users = plan.users_for_pool(
        pool,
        multiple,
        shape.rounds,
        shape.system_tokens,
        shape.question_tokens,
        shape.answer_tokens,
    )
    return dataclasses.replace(shape, users=users)


async def drive(
    shape: plan.Shape,
    sending: Sending,
    progress: Callable[[str], None],
    hook: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run ``shape`` against the server and return the report (config, summary, requests).
    ``hook`` replaces ``sending.restart_command`` (tests pass a coroutine)."""
    if hook is None and sending.restart_command:
        hook = shell_hook(sending.restart_command)
    async with OpenAIClient(
        sending.url,
        sending.model,
        sending.endpoint,
        sending.ignore_eos,
        sending.timeout_s,
        sending.api_key,
    ) as client:
        model = sending.model or await client.first_model()
        client.model = model
        if sending.pool_multiple is not None:
            shape = await _sized(shape, client, sending.pool_multiple)
            progress(f"sized to the engine's KV cache: {shape.users} users, {shape.documents} docs")
        requests = plan.build(shape, sending.qps)
        progress(f"{len(requests)} requests, workload {shape.workload}")
        record = await runner.run(
            requests,
            client,
            shape.answer_tokens,
            concurrency=sending.concurrency,
            between_rounds=hook,
            ready_timeout_s=sending.ready_timeout_s,
            progress=progress,
        )
    config = {
        "label": sending.label,
        "url": sending.url,
        "model": model,
        "endpoint": sending.endpoint,
        "qps": sending.qps,
        "concurrency": sending.concurrency,
        "ignore_eos": sending.ignore_eos,
        "shape": shape.as_dict(),
        "split_round": shape.split_round,
        "restart_command": sending.restart_command,
        "pool_multiple": sending.pool_multiple,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "kvtier": kvtier.__version__,
        "environment": environment_line(),
    }
    return {
        "config": config,
        "summary": results.summarize(record, unique=shape.workload == "no-reuse"),
        "segments": [dataclasses.asdict(s) for s in record.segments],
        "requests": [s.as_dict() for s in record.sent],
    }


def api_key(env_name: str | None) -> str | None:
    """The API key from the environment variable ``env_name`` (never a command-line value)."""
    return os.environ.get(env_name) or None if env_name else None
