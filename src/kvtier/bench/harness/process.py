"""``ProcessEngine``: a ``vllm.LLM`` in a child process, driven over a pipe.

An engine lives in its own process so that a test can restart it, kill it, or run two at once,
and so that one engine can serve many tests. ``kvtier.bench.harness.child`` is the program the
child runs. Wire format: one JSON object per line; requests go to the child's stdin, replies
come back on a dedicated pipe (the child's stdout and stderr are vLLM's log, kept in a file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvtier.bench.harness.engine import (
    EngineBase,
    EngineConfig,
    EngineError,
    GenerateResult,
    engine_env,
)


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    return json.loads(line)


class ProcessEngine(EngineBase):
    """Parent-side handle of one engine child. Use as a context manager or call ``close``."""

    def __init__(self, config: EngineConfig, log_path: Path, start_timeout_s: float = 600) -> None:
        self.config = config
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvtier.bench.harness.child", str(write_fd)],
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
        #: The child's pid: also its session id (its processes are the engine's).
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
        self,
        prompts: list[list[int]],
        max_tokens: int = 1,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> tuple[list[GenerateResult], float]:
        reply = self._call(
            op="generate",
            prompts=prompts,
            max_tokens=max_tokens,
            cache_salt=cache_salt,
            kv_transfer_params=kv_transfer_params,
        )
        return [GenerateResult(**r) for r in reply["results"]], reply["elapsed_s"]

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
    def close(self, timeout_s: float = 120) -> int | None:  # type: ignore[override]
        """Ask the child to shut the engine down cleanly; kill it if it does not. Returns the
        child's exit code."""
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
        self._cleanup()

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self._replies.close()
        if not self._log.closed:
            self._log.close()


def result_message(result: GenerateResult) -> dict[str, Any]:
    """A result as the child sends it (fields left unset are left out)."""
    return {k: v for k, v in dataclasses.asdict(result).items() if v is not None}
