"""``ServerProcess``: ``kvtier serve`` (vLLM's OpenAI-compatible server) on loopback."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from kvtier.cli.serve import serve_env
from kvtier.devtools.openai_client import ServerClient


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """One ``kvtier serve`` process; ``stop()`` sends SIGTERM like a service manager would."""

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
    ) -> None:
        self.port = port or free_port()
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
        if allow_small_tiers:
            argv.append("--allow-small-tiers")
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
        ]
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.client = ServerClient(f"http://127.0.0.1:{self.port}", "model")
        try:
            self.client.wait_ready(ready_timeout_s, lambda: self.proc.poll() is None)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM the server; SIGKILL its whole session if it does not exit in time."""
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
