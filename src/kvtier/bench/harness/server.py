"""``ServerEngine``: ``kvtier serve`` (vLLM's OpenAI-compatible server) on loopback, over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvtier.bench.harness.engine import EngineBase, GenerateResult
from kvtier.bench.openai_client import ServerClient
from kvtier.launch import API_SERVER_MODULE, serve_env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerEngine(EngineBase):
    """One ``kvtier serve`` process; ``close()`` sends SIGTERM like a service manager would.

    ``generate`` streams each prompt (concurrently for a batch): ``ttft_s`` is client-side (request
    sent -> first chunk), ``text`` is set, and ``num_cached_tokens`` comes from the usage the
    server reports (``--enable-prompt-tokens-details``). ``ignore_eos``: stop at EOS or not
    (the other drivers never stop early; the demo wants the model's own answer).

    ``wait=False`` returns as soon as the process is spawned, so several servers can start at
    once; call ``wait_ready()`` before the first request (and ``close()`` either way).

    ``extra_args`` go after the server's own (``kvtier serve`` options such as
    ``--disk-capacity`` or vLLM's). ``kvtier=False`` starts vLLM's own API server with the same
    vLLM settings and no offloading at all (the tier options are then ignored): a reference
    whose scheduler and batch shapes match the kvtier server's. ``env_overrides`` are set in
    the server's environment last.
    """

    def __init__(
        self,
        model_dir: Path,
        log: Path,
        host_pool: str = "2GiB",
        disk_dir: Path | None = None,
        port: int | None = None,
        max_model_len: int = 8192,
        ready_timeout_s: float = 600,
        allow_small_tiers: bool = False,
        ignore_eos: bool = True,
        shared: str | None = None,
        restore_decision: bool = True,
        wait: bool = True,
        extra_args: Sequence[str] = (),
        kvtier: bool = True,
        env_overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.ignore_eos = ignore_eos
        env = serve_env()
        # A development server: offline unless the caller says otherwise (`kvtier serve` itself
        # passes the user's environment through).
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.update(
            VLLM_SERVER_DEV_MODE="1",  # exposes /reset_prefix_cache
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        )
        env.update(env_overrides or {})
        if kvtier:
            argv = [
                sys.executable,
                "-m",
                "kvtier.cli",
                "serve",
                str(model_dir),
                "--host-pool",
                host_pool,
            ]
            if disk_dir is not None:
                argv += ["--disk-dir", str(disk_dir)]
            if shared is not None:
                argv += ["--shared", shared]
            if allow_small_tiers:
                argv.append("--allow-small-tiers")
            if not restore_decision:
                argv.append("--no-restore-decision")
        else:
            argv = [sys.executable, "-m", API_SERVER_MODULE, "--model", str(model_dir)]
        argv += [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            "model",
            "--max-model-len",
            str(max_model_len),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--max-num-seqs",
            "4",
            "--enable-prompt-tokens-details",
            *extra_args,
        ]
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")  # noqa: SIM115 - closed in close()
        self._ready_timeout_s = ready_timeout_s
        self._started = time.perf_counter()
        #: Seconds from spawn to ready (0 until ``wait_ready`` returns).
        self.start_s = 0.0
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.client = ServerClient(f"http://127.0.0.1:{self.port}", "model")
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the server answers /health; on failure or timeout close it and raise."""
        try:
            self.client.wait_ready(self._ready_timeout_s, lambda: self.proc.poll() is None)
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - self._started

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int = 1,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> tuple[list[GenerateResult], float]:
        def one(prompt: list[int]) -> GenerateResult:
            out = self.client.complete_stream(
                prompt, max_tokens, cache_salt, self.ignore_eos, kv_transfer_params
            )
            return GenerateResult(
                token_ids=out.token_ids,
                num_cached_tokens=out.cached_tokens or 0,
                ttft_s=out.ttft_s,
                output_tokens=len(out.token_ids),
                text=out.text,
            )

        started = time.perf_counter()
        if len(prompts) == 1:
            results = [one(prompts[0])]
        else:
            with ThreadPoolExecutor(len(prompts)) as pool:
                results = list(pool.map(one, prompts))
        return results, time.perf_counter() - started

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        return self.client.reset_prefix_cache(reset_external=reset_connector)

    def metrics(self) -> dict[str, float]:
        return self.client.metrics()

    def close(self, timeout_s: float = 60) -> int:  # type: ignore[override]
        """SIGTERM the server; SIGKILL its whole session if it does not exit in time. Returns
        the server's exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode
