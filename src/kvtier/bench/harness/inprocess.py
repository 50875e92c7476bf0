"""``InProcessEngine``: a ``vllm.LLM`` in this process.

With vLLM's multiprocessing off (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, uniprocess executor:
``EngineConfig(in_process=True)``) the scheduler and the worker live in this process too, and a
tiny model's engine starts in ~5 s instead of ~40 s, so one process can run many engines one
after another (the model matrix). ``ProcessEngine``'s child serves its requests with this class.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

from kvtier.bench.harness.engine import EngineBase, EngineConfig, GenerateResult, metric_key


class InProcessEngine(EngineBase):
    """One ``vllm.LLM`` built from ``config.engine_args()``, or from ``engine_args`` when given
    (``config.env`` is not applied: the process's environment is the engine's). A refused start
    leaves no vLLM state behind."""

    def __init__(self, config: EngineConfig, engine_args: dict[str, Any] | None = None) -> None:
        from vllm import LLM

        self.config = config
        _forget_kvtier_metrics()
        started = time.perf_counter()
        try:
            self.llm = LLM(**(engine_args if engine_args is not None else config.engine_args()))
        except BaseException:
            reset_after_failed_start()
            raise
        self.start_s = time.perf_counter() - started
        self._closed = False

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int = 1,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> tuple[list[GenerateResult], float]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        extra = {} if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0, extra_args=extra
        )
        salt = {} if cache_salt is None else {"cache_salt": cache_salt}
        requests = [TokensPrompt(prompt_token_ids=p, **salt) for p in prompts]  # type: ignore[typeddict-item]
        started = time.perf_counter()
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        self._settle()
        return [_result(o) for o in outputs], elapsed

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        return bool(self.llm.reset_prefix_cache(reset_connector=reset_connector))

    def metrics(self) -> dict[str, float]:
        """Counters and gauges of ``LLM.get_metrics()`` (histograms left out), and kvtier's
        own ``kvtier:*`` counters and gauges, which ``get_metrics()`` leaves out (it keeps
        ``vllm:*`` only) but ``/metrics`` serves."""
        flat: dict[str, float] = {}
        for metric in self.llm.get_metrics():
            value = getattr(metric, "value", None)
            if isinstance(value, int | float):
                flat[metric_key(metric.name, metric.labels)] = float(value)
        flat.update(_kvtier_metrics())
        return flat

    def kv_groups(self) -> list[dict[str, Any]]:
        """The engine's KV cache groups (spec type, layer count); [] when EngineCore runs in
        another process."""
        with contextlib.suppress(AttributeError):
            core = self.llm.llm_engine.engine_core.engine_core
            return [
                {"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names)}
                for g in core.scheduler.kv_cache_config.kv_cache_groups
            ]
        return []

    def close(self, collect: bool = True) -> None:
        """Shut the engine down. ``collect``: free its memory now, for the next engine in this
        process (a full collection: seconds on a busy machine); a process about to exit skips
        it."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        if collect:
            gc.collect()

    def _settle(self, timeout_s: float = 60.0) -> None:
        """In-process engines step only when called: keep stepping while the connector has work.

        A multi-process EngineCore runs its own loop and keeps stepping while the offloading
        connector has store jobs in flight; an in-process one stops when ``generate`` returns,
        which would leave the last request's blocks unstored until the next call.
        """
        core = getattr(getattr(self.llm.llm_engine, "engine_core", None), "engine_core", None)
        scheduler = getattr(core, "scheduler", None)
        if scheduler is None:
            return  # multi-process engine: its own loop settles
        deadline = time.monotonic() + timeout_s
        while scheduler.has_requests() and time.monotonic() < deadline:
            self.llm.llm_engine.step()


def _result(output: Any) -> GenerateResult:
    """A request's tokens, cached-token count and, when vLLM kept them, its timings."""
    result = GenerateResult(list(output.outputs[0].token_ids), output.num_cached_tokens or 0)
    stats = getattr(output, "metrics", None)
    if stats is not None and stats.first_token_ts:
        result.ttft_s = float(stats.first_token_latency)
        result.decode_s = float(stats.last_token_ts - stats.first_token_ts)
        result.output_tokens = int(stats.num_generation_tokens)
    return result


def _kvtier_metrics() -> dict[str, float]:
    """``kvtier:*`` counter and gauge samples of prometheus_client's global registry, keyed as
    ``metric_key`` does (counters under their own name, without ``_total``)."""
    from prometheus_client import REGISTRY

    flat: dict[str, float] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("kvtier:") or family.type not in ("counter", "gauge"):
            continue
        for sample in family.samples:
            if sample.name in (family.name, family.name + "_total"):
                flat[metric_key(family.name, sample.labels)] = float(sample.value)
    return flat


def _forget_kvtier_metrics() -> None:
    """Unregister the ``kvtier:*`` collectors an earlier engine of this process left behind.

    vLLM drops its own ``vllm:*`` collectors from prometheus_client's global registry when an
    engine's stat logger starts (``unregister_vllm_metrics``), but not those a connector
    declares: a second in-process engine would fail with ``DuplicateTimeseries``. One engine per
    process (every real deployment) never needs this.
    """
    from prometheus_client import REGISTRY

    for collector in list(REGISTRY._collector_to_names):
        if str(getattr(collector, "_name", "")).startswith("kvtier:"):
            REGISTRY.unregister(collector)


def reset_after_failed_start() -> None:
    """Drop what a half-initialised in-process engine left in vLLM's module globals.

    A refused start can leave the worker's KV connector registered (``ensure_kv_transfer_
    initialized`` returns early for every later engine of the process, which then runs with
    the wrong one) and the parallel groups initialised.
    """
    from vllm.distributed import parallel_state
    from vllm.distributed.kv_transfer import kv_transfer_state

    with contextlib.suppress(Exception):
        kv_transfer_state.ensure_kv_transfer_shutdown()
    with contextlib.suppress(Exception):
        parallel_state.destroy_model_parallel()
    with contextlib.suppress(Exception):
        parallel_state.destroy_distributed_environment()
    gc.collect()
