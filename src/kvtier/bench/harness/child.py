"""The engine child of ``ProcessEngine``: hosts one ``InProcessEngine`` and answers requests.

Run as ``python -m kvtier.bench.harness.child <reply_fd>`` with the engine arguments as the
first JSON line on stdin.
"""

import logging
import os
import sys
import traceback
from typing import Any

from kvtier.bench.harness.engine import EngineConfig
from kvtier.bench.harness.process import decode, encode, result_message


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
    replies = os.fdopen(int(sys.argv[1]), "wb", buffering=0)
    stdin = sys.stdin.buffer

    def reply(**message: Any) -> None:
        replies.write(encode(message))

    try:
        from kvtier.bench.harness.inprocess import InProcessEngine

        args = decode(stdin.readline())  # computed by the parent from its EngineConfig
        engine = InProcessEngine(EngineConfig(model=args["model"]), engine_args=args)
        reply(ok=True, start_s=engine.start_s, pid=os.getpid())
    except BaseException:
        reply(ok=False, error=traceback.format_exc())
        raise

    for line in stdin:
        request = decode(line)
        op = request["op"]
        try:
            if op == "generate":
                results, elapsed = engine.generate(
                    request["prompts"],
                    request["max_tokens"],
                    request.get("cache_salt"),
                    request.get("kv_transfer_params"),
                )
                reply(ok=True, elapsed_s=elapsed, results=[result_message(r) for r in results])
            elif op == "reset_prefix_cache":
                reply(ok=True, result=engine.reset_prefix_cache(request["reset_connector"]))
            elif op == "metrics":
                reply(ok=True, result=engine.metrics())
            elif op == "shutdown":
                reply(ok=True)
                break
            else:
                reply(ok=False, error=f"unknown op {op!r}")
        except Exception:
            reply(ok=False, error=traceback.format_exc())
    # Shut the engine down the normal way (EngineCore, workers and tiers cleaned up), then
    # leave without the interpreter's own teardown: torch's library finalizers and the final
    # garbage collection took 7-12 s per engine on 2 busy cores, all after the engine was
    # gone, and each test closing an engine waited for it.
    code = 0
    try:
        engine.close(collect=False)
    except BaseException:
        traceback.print_exc()
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
