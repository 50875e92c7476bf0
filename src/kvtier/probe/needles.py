"""``kvtier probe needles``: needles in many sessions, evicted, restored in concurrent waves.

1. ``sessions`` sessions, each a session-unique header, filler text and five needles ("the
   access code of <session> vault <n> is <code>") at 10/30/50/70/90 % depth, about
   ``session_tokens`` tokens; five questions per session, one per needle.
2. Model-only baseline: the same prompts on an engine without offloading.
3. kvtier engine: every session served once (its prefix is stored), then filler prompts whose
   total exceeds the engine's KV pool (computed from the engine's own cache size) are pushed
   through it, so a revisit can only come from kvtier's tiers.
4. Restores in concurrent waves of ``wave`` sessions (all five questions of a session at once);
   each request's ``num_cached_tokens`` shows it was restored.
5. Scoring (kvtier.probe.scoring): truncated restore, cross-session mix-up and model
   miss told apart; the probe passes when every needle the baseline found is found after restore.
"""

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import kvtier
from kvtier.bench.harness import Engine, EngineConfig, ProcessEngine
from kvtier.bench.prompts import random_prompt
from kvtier.bench.report import markdown_table
from kvtier.probe.scoring import DEPTHS, Needle, classify, session_verdict

NAMES = [
    "amber",
    "basalt",
    "cedar",
    "dune",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "iris",
    "juniper",
    "kestrel",
    "lagoon",
    "marble",
    "nectar",
    "onyx",
    "prairie",
    "quartz",
    "raven",
    "sierra",
    "tundra",
]
FILLER = [
    "The archive kept records of tides, harvests and the slow drift of trade routes.",
    "Engineers argued about the bridge for a decade before the first stone was laid.",
    "In winter the valley road closed and the village lived on stored grain and stories.",
    "The observatory logged every comet it could find and most of them twice.",
    "A cartographer redrew the coast after each storm moved the sandbanks again.",
    "The guild met on the first day of each month to settle accounts and disputes.",
]


@dataclass
class Session:
    name: str
    text: str
    needles: list[Needle]

    def question(self, needle: Needle) -> str:
        vault = DEPTHS.index(needle.depth) + 1
        return (
            f"{self.text}\n\nQuestion: what is the access code of {self.name} vault "
            f"{vault}? Reply with the number only.\nAnswer:"
        )


def build_sessions(count: int, approx_tokens: int, seed: int = 0) -> list[Session]:
    rng = random.Random(seed)
    codes = rng.sample(range(1000, 9999), count * len(DEPTHS))
    sessions = []
    sentences_total = max(len(DEPTHS) + 1, approx_tokens // 17)
    for s in range(count):
        name = f"{NAMES[s % len(NAMES)]}-{s}"
        needles = [Needle(name, d, str(codes[s * len(DEPTHS) + i])) for i, d in enumerate(DEPTHS)]
        body = [rng.choice(FILLER) for _ in range(sentences_total)]
        for i, needle in reversed(list(enumerate(needles))):
            at = int(needle.depth * len(body))
            body.insert(at, f"Note: the access code of {name} vault {i + 1} is {needle.code}.")
        header = f"Session {name}. This is the private log of {name}; keep it confidential."
        sessions.append(Session(name, header + "\n" + " ".join(body), needles))
    return sessions


def _ask(engine: Engine, tokenizer, sessions: list[Session], max_tokens: int):
    prompts, index = [], []
    for session in sessions:
        for needle in session.needles:
            prompts.append(tokenizer.encode(session.question(needle)))
            index.append((session, needle))
    results, _ = engine.generate(prompts, max_tokens=max_tokens)
    return [
        (s, n, tokenizer.decode(r.token_ids), r.num_cached_tokens)
        for (s, n), r in zip(index, results, strict=True)
    ]


def run(
    model: str,
    out: Path,
    sessions: int = 6,
    session_tokens: int = 1200,
    wave: int = 3,
    engine_blocks: int = 96,
    max_tokens: int = 12,
    progress: Callable[[str], None] = print,
    in_process: bool = False,
) -> dict:
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(model)
    all_sessions = build_sessions(sessions, session_tokens)
    all_needles = [n for s in all_sessions for n in s.needles]
    # A small engine pool (engine_blocks x 128 tokens) keeps the eviction filler affordable.
    common = {
        "model": model,
        "max_model_len": session_tokens + 512,
        "max_num_seqs": 8,
        "extra_args": {"num_gpu_blocks_override": engine_blocks},
        "in_process": in_process,
    }
    baseline: dict[str, dict[float, str]] = {}
    baseline_text: dict[tuple[str, float], str] = {}
    with ProcessEngine(EngineConfig(**common), out / "probe-baseline.log") as engine:
        progress("model-only baseline...")
        for s, n, answer, _ in _ask(engine, tokenizer, all_sessions, max_tokens):
            baseline.setdefault(s.name, {})[n.depth] = classify(answer, n, all_needles)
            baseline_text[(s.name, n.depth)] = answer
    transfer = kvtier.kv_transfer_config(
        host_pool="1GiB", disk_dir=out / "probe-disk", disk_capacity="4GiB"
    )
    restored: dict[str, dict[float, str]] = {}
    answers: list[dict] = []
    with ProcessEngine(
        EngineConfig(kv_transfer_config=transfer, **common), out / "probe-kvtier.log"
    ) as engine:
        progress("storing every session...")
        for session in all_sessions:
            engine.generate_one(tokenizer.encode(session.question(session.needles[0])), 1)
        pool_tokens = engine_blocks * 128
        filler_tokens = 0
        progress(f"evicting: pushing > {pool_tokens} filler tokens through the engine...")
        while filler_tokens <= pool_tokens:
            prompt = random_prompt(1_000_000 + filler_tokens, session_tokens, 40000, low=100)
            engine.generate_one(prompt, 1)
            filler_tokens += len(prompt)
        for start in range(0, len(all_sessions), wave):
            batch = all_sessions[start : start + wave]
            progress(f"restoring wave {start // wave + 1}: {[s.name for s in batch]}")
            for s, n, answer, cached in _ask(engine, tokenizer, batch, max_tokens):
                restored.setdefault(s.name, {})[n.depth] = classify(answer, n, all_needles)
                answers.append(
                    {
                        "session": s.name,
                        "depth": n.depth,
                        "code": n.code,
                        "answer": answer,
                        "baseline_answer": baseline_text[(s.name, n.depth)],
                        "cached_tokens": cached,
                    }
                )
    verdicts = {s.name: session_verdict(baseline[s.name], restored[s.name]) for s in all_sessions}
    rows = []
    for s in all_sessions:
        b = sum(c == "found" for c in baseline[s.name].values())
        r = sum(c == "found" for c in restored[s.name].values())
        cached = min(a["cached_tokens"] for a in answers if a["session"] == s.name)
        rows.append([s.name, f"{b}/5", f"{r}/5", cached, verdicts[s.name]])
    passed = all(v == "ok" for v in verdicts.values())
    markdown = markdown_table(
        ["session", "baseline found", "after restore found", "min cached tokens", "verdict"], rows
    )
    identical = sum(a["answer"] == a["baseline_answer"] for a in answers)
    markdown += (
        f"\n\n{sum(v == 'ok' for v in verdicts.values())}/{len(verdicts)} sessions ok; "
        f"answers identical to the model-only baseline: {identical}/{len(answers)}; "
        f"filler pushed: {filler_tokens} tokens > engine pool {pool_tokens} tokens."
    )
    (out / "needles.md").write_text(markdown + "\n")
    (out / "needles.json").write_text(
        json.dumps(
            {
                "verdicts": verdicts,
                "identical_answers": identical,
                "baseline": baseline,
                "answers": answers,
                "config": {
                    "model": model,
                    "sessions": sessions,
                    "session_tokens": session_tokens,
                    "wave": wave,
                    "engine_blocks": engine_blocks,
                },
            },
            indent=2,
            default=str,
        )
    )
    return {
        "passed": passed,
        "verdicts": verdicts,
        "identical_answers": identical,
        "answers": len(answers),
        "markdown": markdown,
    }
