"""The demo: a real model served with kvtier, cold vs restored time to first token.

1. ``kvtier serve`` SmolLM2-135M-Instruct with a host pool and a disk tier;
2. a long prompt, cold; 3. the engine's prefix cache reset, same prompt (host-pool restore);
4. the server restarted, same prompt (disk restore in a fresh process);
then a bar chart of time to first token and where each prompt token came from.
"""

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvtier.devtools.harness import GenerateResult
from kvtier.devtools.harness.server import ServerEngine

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
    result: GenerateResult
    sources: dict[str, float]

    @property
    def ttft_s(self) -> float:
        assert self.result.ttft_s is not None  # the server driver always measures it
        return self.result.ttft_s


def measure(server: ServerEngine, name: str, prompt: list[int]) -> Phase:
    return Phase(name, *server.measured(prompt, MAX_TOKENS, SOURCES))


def render(console: Console, phases: list[Phase], num_tokens: int) -> None:
    cold = phases[0].ttft_s
    width = 30
    chart = Table(title=f"Time to first token, {num_tokens}-token prompt, SmolLM2-135M on CPU")
    chart.add_column("request")
    chart.add_column("TTFT", justify="right")
    chart.add_column("speed-up", justify="right")
    chart.add_column("", no_wrap=True)
    for phase in phases:
        ttft = phase.ttft_s
        bar = "█" * max(1, round(width * ttft / cold))
        chart.add_row(phase.name, f"{ttft:.2f} s", f"{cold / ttft:.1f}×", bar)
    console.print(chart)
    sources = Table(title="Where the prompt tokens came from (vLLM's prompt_tokens_*_by_source)")
    sources.add_column("request")
    for label in SOURCES:
        sources.add_column(label, justify="right")
    for phase in phases:
        sources.add_row(phase.name, *(f"{phase.sources[label]:.0f}" for label in SOURCES))
    console.print(sources)


def _start(model_dir: Path, log: Path, disk: Path, port: int) -> ServerEngine:
    # The demo shows the model's own answer: stop at its end-of-sequence token.
    return ServerEngine(model_dir, log, disk_dir=disk, port=port, ignore_eos=False)


def run_demo(tokens: int, port: int, work_dir: Path | None) -> int:
    from kvtier.devtools.models import smollm2

    console = Console(width=None if sys.stdout.isatty() else 100)
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
            server = _start(model_dir, work / "server-1.log", disk, port)
        with err.status(f"Cold prefill of {len(prompt)} tokens..."):
            phases.append(measure(server, "cold prefill", prompt))
        server.reset_prefix_cache()
        with err.status("Prefix cache reset; same prompt again..."):
            phases.append(measure(server, "host-pool restore", prompt))
        with err.status("Restarting the server (the host pool is gone, the disk tier stays)..."):
            server.close()
            server = _start(model_dir, work / "server-2.log", disk, port)
        with err.status("Same prompt on the fresh server..."):
            phases.append(measure(server, "disk restore, restarted", prompt))
            reference = measure(server, "engine cache hit", prompt)
    except Exception as exc:
        err.print(f"kvtier demo failed: {exc}\nserver logs in {work}")
        return 1
    finally:
        if server is not None:
            server.close()
    phases.append(reference)
    render(console, phases, len(prompt))
    restored = [p.result.text for p in phases[1:]]
    same = all(text == reference.result.text for text in restored)
    console.print(
        f"Restored outputs equal the engine's own prefix-cache resume: {'yes' if same else 'NO'}"
    )
    console.print(f"Answer: {(phases[-1].result.text or '').strip()!r}")
    console.print(f"Logs and the disk tier: {work}")
    return 0 if same else 1
