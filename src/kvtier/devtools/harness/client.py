"""``EngineProcess``: a vLLM engine in a child process, driven by token-id prompts."""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kvtier
from kvtier.devtools.harness.protocol import decode, encode
from kvtier.errors import KvtierError

SRC_DIR = Path(kvtier.__file__).resolve().parent.parent


class EngineError(KvtierError):
    """The engine child failed; the message carries its traceback and the log path."""


@dataclass
class EngineConfig:
    """What to start: a model folder, optional kvtier config, and engine settings."""

    model: str
    kv_transfer_config: dict[str, Any] | None = None
    max_model_len: int = 4096
    max_num_seqs: int = 8
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: the engine's own KV pool, in GiB
    dtype: str = "float32"
    skip_tokenizer_init: bool = True
    tensor_parallel_size: int = 1
    block_size: int | None = None
    #: Run EngineCore and the worker inside the child process (starts in about half the time:
    #: one process imports torch and vLLM instead of three). Tests use it where the process
    #: split does not matter; benchmarks and multi-process behaviour use the default.
    in_process: bool = False
    extra_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def engine_args(self) -> dict[str, Any]:
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


@dataclass
class GenerateResult:
    token_ids: list[int]
    num_cached_tokens: int
    #: Engine-side arrival -> first token, when vLLM recorded it (log stats on).
    ttft_s: float | None = None
    #: First -> last token.
    decode_s: float | None = None
    output_tokens: int | None = None


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


class EngineProcess:
    """Parent-side handle of one engine child. Use as a context manager or call ``close``."""

    def __init__(self, config: EngineConfig, log_path: Path, start_timeout_s: float = 600) -> None:
        self.config = config
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvtier.devtools.harness.child", str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            env=engine_env(config),
            start_new_session=True,  # so kill() can take the engine's own children with it
        )
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "rb", buffering=0)
        self._buffer = b""
        self._send(config.engine_args())
        hello = self._receive(start_timeout_s)
        self.start_s: float = hello["start_s"]
        self.pid: int = hello["pid"]

    # -- protocol -------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(encode(message))
        self._proc.stdin.flush()

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineError(
                    f"engine did not answer in {timeout_s:.0f} s; log: {self.log_path}"
                )
            ready, _, _ = select.select([self._replies], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(self._replies.fileno(), 1 << 16)
                if not chunk:
                    raise EngineError(
                        f"engine exited (code {self._proc.poll()}); log: {self.log_path}\n"
                        + self.log_tail()
                    )
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = decode(line)
        if not message.get("ok"):
            raise EngineError(f"{message.get('error')}\nlog: {self.log_path}")
        return message

    def _call(self, timeout_s: float = 900, **request: Any) -> dict[str, Any]:
        self._send(request)
        return self._receive(timeout_s)

    # -- operations -----------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], max_tokens: int = 1, cache_salt: str | None = None
    ) -> tuple[list[GenerateResult], float]:
        """Greedy-generate for each prompt; return results and the wall time of the batch."""
        reply = self._call(
            op="generate", prompts=prompts, max_tokens=max_tokens, cache_salt=cache_salt
        )
        results = [GenerateResult(**r) for r in reply["results"]]
        return results, reply["elapsed_s"]

    def generate_one(
        self, prompt: list[int], max_tokens: int = 1, cache_salt: str | None = None
    ) -> tuple[GenerateResult, float]:
        results, elapsed = self.generate([prompt], max_tokens, cache_salt)
        return results[0], elapsed

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        return self._call(op="reset_prefix_cache", reset_connector=reset_connector)["result"]

    def metrics(self) -> dict[str, float]:
        return self._call(op="metrics")["result"]

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    # -- lifetime -------------------------------------------------------------------------
    def close(self, timeout_s: float = 120) -> int | None:
        """Ask the child to shut the engine down cleanly; kill it if it does not."""
        if self._proc.poll() is None:
            try:
                self._call(timeout_s=timeout_s, op="shutdown")
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=timeout_s)
            except (EngineError, OSError, subprocess.TimeoutExpired):
                self.kill()
        self._cleanup()
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL the child and every process of its session (EngineCore, workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        # Children of the session that outlived the leader (EngineCore) die with the group.
        self._cleanup()

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self._replies.close()
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> "EngineProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dump_config(config: EngineConfig) -> str:
    return json.dumps(config.engine_args(), indent=2, default=str)
