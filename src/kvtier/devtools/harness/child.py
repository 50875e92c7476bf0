"""The engine child: hosts one ``vllm.LLM`` and answers ``EngineProcess`` requests.

Run as ``python -m kvtier.devtools.harness.child <reply_fd>`` with the engine arguments as the first JSON
line on stdin.
"""

import os
import sys
import time
import traceback
from typing import Any

from kvtier.devtools.harness.protocol import decode, encode


def _metrics(llm: Any) -> dict[str, float]:
    """Flatten ``LLM.get_metrics()`` into ``{"name{k=v,...}": value}`` (counters and gauges)."""
    flat: dict[str, float] = {}
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if not isinstance(value, int | float):
            continue
        labels = ",".join(
            f"{k}={v}"
            for k, v in sorted(metric.labels.items())
            if k not in ("model_name", "engine")
        )
        flat[f"{metric.name}{{{labels}}}"] = float(value)
    return flat


def _timings(output: Any) -> dict[str, float]:
    """Engine-side time to first token and decode time of one request, when vLLM kept them."""
    stats = getattr(output, "metrics", None)
    if stats is None or not stats.first_token_ts:
        return {}
    return {
        "ttft_s": float(stats.first_token_latency),
        "decode_s": float(stats.last_token_ts - stats.first_token_ts),
        "output_tokens": int(stats.num_generation_tokens),
    }


def _settle(llm: Any, timeout_s: float = 60.0) -> None:
    """In-process engines step only when called: keep stepping while the connector has work.

    A multi-process EngineCore runs its own loop and keeps stepping while the offloading
    connector has store jobs in flight; an in-process one stops when ``generate`` returns, which
    would leave the last request's blocks unstored until the next call.
    """
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None:
        return  # multi-process engine: its own loop settles
    deadline = time.monotonic() + timeout_s
    while scheduler.has_requests() and time.monotonic() < deadline:
        llm.llm_engine.step()


def _die_with_parent() -> None:
    """Take the whole engine (EngineCore, workers: our process group) down with us.

    vLLM's EngineCore outlives a SIGTERMed front end as an orphan; a test runner that dies
    must not leave engines behind, so SIGTERM (also sent by the kernel when our parent dies)
    kills our process group.
    """
    import ctypes
    import signal

    def kill_group(signum: int, frame: Any) -> None:
        os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_group)
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def main() -> None:
    _die_with_parent()
    reply_fd = int(sys.argv[1])
    replies = os.fdopen(reply_fd, "wb", buffering=0)
    stdin = sys.stdin.buffer

    def reply(**message: Any) -> None:
        replies.write(encode(message))

    engine_args = decode(stdin.readline())
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        started = time.perf_counter()
        llm = LLM(**engine_args)
        reply(ok=True, start_s=time.perf_counter() - started, pid=os.getpid())
    except BaseException:
        reply(ok=False, error=traceback.format_exc())
        raise

    for line in stdin:
        request = decode(line)
        op = request["op"]
        try:
            if op == "generate":
                params = SamplingParams(
                    temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True, seed=0
                )
                prompts = [TokensPrompt(prompt_token_ids=p) for p in request["prompts"]]
                extra = {}
                if request.get("cache_salt") is not None:
                    prompts = [
                        TokensPrompt(prompt_token_ids=p, cache_salt=request["cache_salt"])
                        for p in request["prompts"]
                    ]
                t0 = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False, **extra)
                elapsed = time.perf_counter() - t0
                _settle(llm)
                reply(
                    ok=True,
                    elapsed_s=elapsed,
                    results=[
                        {
                            "token_ids": list(o.outputs[0].token_ids),
                            "num_cached_tokens": o.num_cached_tokens or 0,
                            **_timings(o),
                        }
                        for o in outputs
                    ],
                )
            elif op == "reset_prefix_cache":
                done = llm.reset_prefix_cache(reset_connector=request.get("reset_connector", False))
                reply(ok=True, result=bool(done))
            elif op == "metrics":
                reply(ok=True, result=_metrics(llm))
            elif op == "shutdown":
                reply(ok=True)
                break
            else:
                reply(ok=False, error=f"unknown op {op!r}")
        except Exception:
            reply(ok=False, error=traceback.format_exc())
    # Let vLLM shut its engine down the normal way (worker cleanup runs).
    del llm


if __name__ == "__main__":
    main()
