"""The one interface every engine driver offers, and what they share.

Three drivers implement ``Engine`` (``open_engine`` starts either vLLM driver):

* ``ProcessEngine`` (``kvtier.bench.harness.process``): a ``vllm.LLM`` in a child process,
  driven over a pipe. Tests, benchmarks and probes; the child can be killed or restarted.
* ``InProcessEngine`` (``kvtier.bench.harness.inprocess``): a ``vllm.LLM`` in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so many small engines share one import of torch and
  vLLM (the model matrix, the pool-on-disk bench). It also runs inside ``ProcessEngine``'s
  child, so both drivers serve requests with the same code.
* ``ServerEngine`` (``kvtier.bench.harness.server``): ``kvtier serve`` (vLLM's
  OpenAI-compatible server) on loopback, driven over HTTP. The demo and server tests.

Prompts are token ids; generation is greedy (temperature 0, ``ignore_eos``), so the same prompt
gives the same tokens on every driver. Metrics are keyed ``name{label=value,...}`` with the
``model_name`` and ``engine`` labels dropped and counters under their own name (no ``_total``),
whichever driver read them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import kvtier
from kvtier.errors import KvtierError

SRC_DIR = Path(kvtier.__file__).resolve().parent.parent
#: Labels every sample of one engine carries; dropped from metric keys.
_ENGINE_LABELS = ("model_name", "engine")


class EngineError(KvtierError):
    """An engine failed; the message carries its traceback or reason and, if any, its log."""


@dataclass
class GenerateResult:
    """One request's outcome."""

    token_ids: list[int]
    num_cached_tokens: int
    #: Time to first token: engine-side (arrival -> first token) for the vLLM drivers, when
    #: vLLM recorded it; client-side (request sent -> first chunk) for the server driver.
    ttft_s: float | None = None
    #: First -> last token (vLLM drivers only).
    decode_s: float | None = None
    output_tokens: int | None = None
    #: Generated text (server driver only: the others run without a tokenizer).
    text: str | None = None


@dataclass
class EngineConfig:
    """What to start: a model folder, optional kvtier config, and engine settings."""

    model: str
    kv_transfer_config: dict[str, Any] | None = None
    max_model_len: int = 4096
    max_num_seqs: int = 8
    #: VLLM_CPU_KVCACHE_SPACE: the engine's own KV pool, in GiB (child and server drivers;
    #: an in-process engine sizes its pool with ``extra_args["kv_cache_memory_bytes"]``).
    kv_cache_gib: int = 1
    dtype: str = "float32"
    skip_tokenizer_init: bool = True
    tensor_parallel_size: int = 1
    block_size: int | None = None
    #: ProcessEngine only: run EngineCore and the worker inside the child process (starts in
    #: about half the time: one process imports torch and vLLM instead of three). Tests use it
    #: where the process split does not matter; benchmarks and multi-process behaviour do not.
    in_process: bool = False
    extra_args: dict[str, Any] = field(default_factory=dict)
    #: Environment of the child or server process (ignored in-process: this process's own).
    env: dict[str, str] = field(default_factory=dict)

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM`` for this configuration."""
        args: dict[str, Any] = {
            "model": self.model,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "dtype": self.dtype,
            "enforce_eager": True,
            "enable_prefix_caching": True,
            "skip_tokenizer_init": self.skip_tokenizer_init,
            "tensor_parallel_size": self.tensor_parallel_size,
            "disable_log_stats": False,
            "seed": 0,
        }
        if self.block_size is not None:
            args["block_size"] = self.block_size
        if self.in_process:
            args["distributed_executor_backend"] = "uni"
        if self.kv_transfer_config is not None:
            args["kv_transfer_config"] = self.kv_transfer_config
        args.update(self.extra_args)
        return args


@runtime_checkable
class Engine(Protocol):
    """A running engine, whichever process it lives in."""

    #: Seconds the engine took to start.
    start_s: float

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int = 1,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> tuple[list[GenerateResult], float]:
        """Greedy-generate for each prompt (one batch); results in order and the batch's wall
        time. Returns once the connector stored what the batch left to store.
        ``kv_transfer_params`` go to every request (e.g. kvtier's per-request opt-out)."""
        ...

    def generate_one(
        self,
        prompt: list[int],
        max_tokens: int = 1,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> tuple[GenerateResult, float]:
        """``generate`` of one prompt."""
        ...

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        """Empty the engine's prefix cache (and the connector's host pool if asked); True once
        done (waits for in-flight stores)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Counters and gauges keyed ``name{label=value,...}`` (see the module docstring)."""
        ...

    def close(self) -> None:
        """Shut the engine down cleanly (idempotent)."""
        ...


class EngineBase:
    """What every driver derives from its ``generate`` and ``metrics``."""

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int = 1,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> tuple[list[GenerateResult], float]:
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def generate_one(
        self,
        prompt: list[int],
        max_tokens: int = 1,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> tuple[GenerateResult, float]:
        results, elapsed = self.generate([prompt], max_tokens, cache_salt, kv_transfer_params)
        return results[0], elapsed

    def measured(
        self, prompt: list[int], max_tokens: int, counters: Mapping[str, str]
    ) -> tuple[GenerateResult, dict[str, float]]:
        """Generate ``prompt`` and return how much each metric of ``counters`` (label ->
        metric key) grew meanwhile (e.g. how many prompt tokens came from each tier)."""
        before = self.metrics()
        result, _ = self.generate_one(prompt, max_tokens)
        after = self.metrics()
        return result, {
            label: after.get(key, 0.0) - before.get(key, 0.0) for label, key in counters.items()
        }

    def __enter__(self) -> EngineBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def metric_key(name: str, labels: Mapping[str, str]) -> str:
    """``name{k=v,...}`` with labels sorted and the per-engine labels dropped."""
    kept = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in _ENGINE_LABELS)
    return f"{name}{{{kept}}}"


def engine_env(config: EngineConfig) -> dict[str, str]:
    """Environment of an engine child: offline, kvtier importable, same core count either way."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_DO_NOT_TRACK", "1")
    env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib)
    # vLLM reserves a core for itself without a KV connector and none with one (it cannot on 2
    # cores); pin zero reserved cores on both sides so engines compare like with like.
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if config.in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.update(config.env)
    return env


Kind = Literal["process", "in_process"]


def open_engine(kind: Kind, config: EngineConfig, log_path: Path) -> EngineBase:
    """Start a vLLM engine of ``kind`` from ``config`` (``log_path``: its log; unused in-process).

    ``ServerEngine`` takes ``kvtier serve`` options rather than an ``EngineConfig``: build it
    directly.
    """
    if kind == "process":
        from kvtier.bench.harness.process import ProcessEngine

        return ProcessEngine(config, log_path)
    if kind == "in_process":
        from kvtier.bench.harness.inprocess import InProcessEngine

        return InProcessEngine(config)
    raise ValueError(f"unknown engine kind {kind!r}")
