"""The demo: a real model served with kvtier, cold vs restored time to first token.

1. ``kvtier serve`` SmolLM2-135M-Instruct with a host pool and a disk tier;
2. a long prompt, cold; 3. the engine's prefix cache reset, same prompt (host-pool restore);
4. the server restarted, same prompt (disk restore in a fresh process);
then a bar chart of time to first token and where each prompt token came from.
"""

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvtier.cli.serve import serve_env
from kvtier.openai_client import ServerClient, StreamResult

MAX_TOKENS = 24
SOURCES = {
    "computed": "vllm:prompt_tokens_by_source{source=local_compute}",
    "engine cache": "vllm:prompt_tokens_by_source{source=local_cache_hit}",
    "host pool": "vllm:prompt_tokens_cached_by_source{source=host}",
    "disk": "vllm:prompt_tokens_cached_by_source{source=disk}",
}

TOPICS = [
    "the history of lighthouses",
    "how bees choose a new hive",
    "the chemistry of bread",
    "tides and the moon",
    "the first transatlantic cable",
    "why glaciers look blue",
    "the migration of arctic terns",
    "how a violin is varnished",
    "the rules of chess openings",
    "the night sky over the desert",
    "the engineering of suspension bridges",
]


def build_prompt(model_dir: Path, num_tokens: int) -> list[int]:
    """A long, varied document truncated to ``num_tokens``, ending with a question."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    parts = []
    for i in range(num_tokens // 20 + 50):
        topic = TOPICS[i % len(TOPICS)]
        parts.append(f"Note {i}: a paragraph about {topic}, written for section {i * 7 % 97}.")
    question = tokenizer.encode(
        "\n\nQuestion: summarise the notes above in one sentence.\nAnswer:",
        add_special_tokens=False,
    )
    body = tokenizer.encode(" ".join(parts), add_special_tokens=False)
    return body[: num_tokens - len(question)] + question


@dataclass
class Phase:
    name: str
    result: StreamResult
    sources: dict[str, float]


class DemoServer:
    """One ``kvtier serve`` process on loopback."""

    def __init__(self, model_dir: Path, disk_dir: Path, port: int, log: Path) -> None:
        env = serve_env()
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
            "--disk-dir",
            str(disk_dir),
            "--host-pool",
            "2GiB",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "8192",
            "--enforce-eager",
            "--dtype",
            "float32",
            "--max-num-seqs",
            "4",
        ]
        self.log = log
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.client = ServerClient(f"http://127.0.0.1:{port}", "smollm2")
        self.client.wait_ready(600, lambda: self.proc.poll() is None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def measure(server: DemoServer, name: str, prompt: list[int]) -> Phase:
    before = server.client.metrics()
    result = server.client.complete_stream(prompt, MAX_TOKENS)
    after = server.client.metrics()
    sources = {label: after.get(key, 0.0) - before.get(key, 0.0) for label, key in SOURCES.items()}
    # vLLM counts restored tokens both as cached-by-source and, for the host pool and disk,
    # as external transfers; the two cached rows split the external count.
    return Phase(name, result, sources)


def render(console: Console, phases: list[Phase], num_tokens: int) -> None:
    cold = phases[0].result.ttft_s
    width = 40
    table = Table(title=f"Time to first token, {num_tokens}-token prompt, SmolLM2-135M (CPU)")
    table.add_column("request")
    table.add_column("TTFT", justify="right")
    table.add_column("")
    table.add_column("vs cold", justify="right")
    for label in SOURCES:
        table.add_column(label, justify="right")
    for phase in phases:
        ttft = phase.result.ttft_s
        bar = "█" * max(1, round(width * ttft / cold))
        table.add_row(
            phase.name,
            f"{ttft:.2f} s",
            bar,
            f"{cold / ttft:.1f}×",
            *(f"{phase.sources[label]:.0f}" for label in SOURCES),
        )
    console.print(table)
    console.print(
        "Columns on the right: prompt tokens by where they came from (vLLM's own "
        "prompt_tokens_by_source / prompt_tokens_cached_by_source counters)."
    )


def run_demo(tokens: int, port: int, work_dir: Path | None) -> int:
    from kvtier.models import smollm2

    console = Console()
    err = Console(stderr=True)
    work = work_dir or Path(tempfile.mkdtemp(prefix="kvtier-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    disk = work / "disk-tier"
    with err.status("Preparing SmolLM2-135M-Instruct (converted once from PyPI's GGUF)..."):
        model_dir = smollm2()
        prompt = build_prompt(model_dir, tokens)
    phases: list[Phase] = []
    server = None
    try:
        with err.status("Starting kvtier serve (about a minute on 2 cores)..."):
            server = DemoServer(model_dir, disk, port, work / "server-1.log")
        with err.status(f"Cold prefill of {len(prompt)} tokens..."):
            phases.append(measure(server, "cold prefill", prompt))
        server.client.reset_prefix_cache()
        with err.status("Prefix cache reset; same prompt again..."):
            phases.append(measure(server, "host-pool restore", prompt))
        with err.status("Restarting the server (the host pool is gone, the disk tier stays)..."):
            server.stop()
            server = DemoServer(model_dir, disk, port, work / "server-2.log")
        with err.status("Same prompt on the fresh server..."):
            phases.append(measure(server, "disk restore after restart", prompt))
            reference = measure(server, "engine prefix-cache hit", prompt)
    except Exception as exc:
        err.print(f"kvtier demo failed: {exc}\nserver logs in {work}")
        return 1
    finally:
        if server is not None:
            server.stop()
    phases.append(reference)
    render(console, phases, len(prompt))
    restored = [p.result.text for p in phases[1:]]
    same = all(text == reference.result.text for text in restored)
    console.print(
        f"Restored outputs equal the engine's own prefix-cache resume: {'yes' if same else 'NO'}"
    )
    console.print(f"Answer: {phases[-1].result.text.strip()!r}")
    console.print(f"Logs and the disk tier: {work}")
    return 0 if same else 1
