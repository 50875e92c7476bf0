"""One process of the real-model end to end: SmolLM2-135M through mlx-lm on MLX, its KV in a paged
cache that vLLM's scheduler and kvtier's MLX connector manage (``tests.mlx.stub_engine``).

``python -m tests.mlx.real_model_run PHASE FOLDER``, with the phases

* ``store``: serve the prompt cold (vLLM's store jobs fill the host pool, the disk tier writes
  records), then compute the reference: a no-offload resume of the same prompt (the full blocks,
  then the tail, then decoding) in a cache of its own;
* ``restore``: a fresh process serves the prompt after a short request of its own, so the
  prompt's blocks get other block ids; the prefix comes back from the disk tier (``restore``);
  then one byte of the first block's record is flipped on disk and another engine serves the
  prompt the same way (``damaged``).

Each engine writes ``FOLDER/NAME.npz``: tokens, the first sampled token's logits, the prefix's
KV bytes as the engine's attention reads them, the tokens vLLM found computed and the block ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.models.cache import create_attention_mask

from kvtier.format.record import HEADER_BYTES as RECORD_HEADER_BYTES
from kvtier.mlx.transfer_config import mlx_transfer_config
from tests.mlx.paged_caches import CacheShape, LayerwiseCache
from tests.mlx.stub_engine import RequestState, StubEngine

BLOCK = 16
#: Several blocks, so that several records are restored into other block ids; few, since each
#: block of SmolLM2 costs seconds of MLX CPU compute per engine that computes it.
PREFIX_BLOCKS = 4
PROMPT_TOKENS = PREFIX_BLOCKS * BLOCK + 8  # full blocks and a tail vLLM computes after a restore
MAX_TOKENS = 4
OTHER_PROMPT_TOKENS = 40
#: A real forward pass on a busy two-core machine can take minutes.
RUN_TIMEOUT_S = 900.0


class PagedLayer:
    """mlx-lm's per-layer cache protocol over one layer of a paged cache and a block table:
    new keys and values go into their blocks (the engine's ``reshape_and_cache``), attention
    reads every token's back through the table (its paged attention)."""

    def __init__(self, cache: LayerwiseCache, layer: int, table: list[int], offset: int) -> None:
        self.cache, self.layer, self.table, self.offset = cache, layer, table, offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        count = keys.shape[2]
        positions = np.arange(self.offset, self.offset + count)
        self.cache.write(
            self.layer,
            self.table,
            positions,
            keys[0].transpose(1, 0, 2),
            values[0].transpose(1, 0, 2),
        )
        self.offset += count
        k, v = self.cache.read(self.layer, self.table, np.arange(self.offset))
        return k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        return create_attention_mask(n, self.offset, return_array, window_size)


def forward(
    model, cache: LayerwiseCache, table: list[int], tokens: list[int], start: int
) -> mx.array:
    """Logits of the last of ``tokens`` (positions ``start``...), their KV written to ``cache``."""
    layers = [PagedLayer(cache, i, table, start) for i in range(cache.shape.num_layers)]
    logits = model(mx.array(tokens)[None], cache=layers)[0, -1].astype(mx.float32)
    mx.eval(logits)
    return logits


def prefix_kv(cache: LayerwiseCache, table: list[int]) -> np.ndarray:
    """The prefix's keys and values, every layer, as bytes, read through ``table``."""
    parts = []
    for layer in range(cache.shape.num_layers):
        k, v = cache.read(layer, table, np.arange(PREFIX_BLOCKS * BLOCK))
        parts += [np.array(mx.view(k, mx.uint8)), np.array(mx.view(v, mx.uint8))]
    return np.concatenate([p.ravel() for p in parts])


class MlxLmEngine(StubEngine):
    """The stub engine with a real model: mlx-lm computes the scheduled tokens."""

    def __init__(self, model_dir: Path, model, transfer: dict, shape: CacheShape) -> None:
        super().__init__(model_dir, "layerwise", shape, transfer)
        self.model = model
        self.logits: dict[str, np.ndarray] = {}

    def forward(self, req_id: str, state: RequestState, positions: np.ndarray) -> int:
        tokens = [state.tokens[p] for p in positions]
        logits = forward(self.model, self.cache, state.block_table, tokens, int(positions[0]))
        self.logits.setdefault(req_id, np.array(logits))
        return int(mx.argmax(logits).item())

    def check_computed(self, req_id: str, state: RequestState) -> None:
        """A real model's KV has no closed form: the test compares it with the reference."""


def shape_of(model_dir: Path, num_blocks: int) -> CacheShape:
    config = json.loads((model_dir / "config.json").read_text())
    heads = config["num_attention_heads"]
    return CacheShape(
        num_layers=config["num_hidden_layers"],
        num_blocks=num_blocks,
        block_size=BLOCK,
        kv_heads=config["num_key_value_heads"],
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
    )


def prompt_tokens(tokenizer) -> list[int]:
    text = " ".join(
        f"Note {i}: the archive in hall {i % 7} keeps ledger {i * 13 % 97} beside map {i % 5}."
        for i in range(60)
    )
    tokens = tokenizer.encode(text)
    assert len(tokens) >= PROMPT_TOKENS, len(tokens)
    return tokens[:PROMPT_TOKENS]


def reference(model, shape: CacheShape, prompt: list[int]) -> dict[str, np.ndarray]:
    """A no-offload resume: the prefix, then the tail, then greedy decoding, in one cache."""
    cache = LayerwiseCache(shape)
    table = list(range(shape.num_blocks))
    prefix = PREFIX_BLOCKS * BLOCK
    forward(model, cache, table, prompt[:prefix], 0)
    logits = forward(model, cache, table, prompt[prefix:], prefix)
    first = np.array(logits)
    tokens = [int(mx.argmax(logits).item())]
    while len(tokens) < MAX_TOKENS:
        logits = forward(model, cache, table, tokens[-1:], len(prompt) + len(tokens) - 1)
        tokens.append(int(mx.argmax(logits).item()))
    return {"tokens": np.array(tokens), "logits": first, "prefix_kv": prefix_kv(cache, table)}


def mutated_resume(model, cache: LayerwiseCache, table: list[int], prompt: list[int]) -> np.ndarray:
    """The tail's next-token logits over a copy of ``cache`` whose prefix has one key changed
    by 0.01: what the logit comparison must tell from the real resume."""
    copy = LayerwiseCache(cache.shape)
    copy.key_caches = [mx.array(a) for a in cache.key_caches]
    copy.value_caches = [mx.array(a) for a in cache.value_caches]
    copy.key_caches[0][table[0], 0, 0, 0] += 0.01
    prefix = PREFIX_BLOCKS * BLOCK
    return np.array(forward(model, copy, table, prompt[prefix:], prefix))


def damage_first_record(disk: Path, first_key: str) -> Path:
    """Flip one payload byte of the record of the prompt's first block; its path."""
    (record,) = [p for p in disk.rglob("*.kvb") if p.name.startswith(first_key)]
    with open(record, "r+b") as f:
        f.seek(RECORD_HEADER_BYTES + 100)
        byte = f.read(1)
        f.seek(RECORD_HEADER_BYTES + 100)
        f.write(bytes([byte[0] ^ 0x01]))
    return record


def serve(name: str, folder: Path, model_dir: Path, model, tokenizer, other_first: bool) -> None:
    """One engine serves the prompt (after a short request of its own when ``other_first``);
    what it computed goes to ``FOLDER/NAME.npz``."""
    transfer = mlx_transfer_config(
        "layerwise",
        "16MiB",
        host_pool="256MiB",
        host_pool_dir=str(folder / "pool"),
        disk_dir=str(folder / "disk"),
        allow_small_tiers=True,
        restore_decision=False,
    )
    engine = MlxLmEngine(model_dir, model, transfer, shape_of(model_dir, num_blocks=64))
    try:
        if other_first:
            other = tokenizer.encode("A short question about something else entirely, " * 4)
            engine.add("other", other[:OTHER_PROMPT_TOKENS], max_tokens=1)
            engine.run(timeout_s=RUN_TIMEOUT_S)
        prompt = prompt_tokens(tokenizer)
        engine.add("prompt", prompt, max_tokens=MAX_TOKENS)
        engine.run(timeout_s=RUN_TIMEOUT_S)
        table = engine.block_tables["prompt"]
        result = {
            "mutated_logits": mutated_resume(model, engine.cache, table, prompt),
            "tokens": np.array(engine.finished["prompt"]),
            "logits": engine.logits["prompt"],
            "prefix_kv": prefix_kv(engine.cache, table),
            "first_computed": np.array(engine.first_computed["prompt"]),
            "block_table": np.array(table),
            "first_key": np.array(engine.first_block_hash["prompt"].hex()),
        }
    finally:
        engine.shutdown()  # drains the disk tier's writes
    np.savez(folder / f"{name}.npz", **result)


def report(folder: Path) -> None:
    """Print what the phases found, side by side (the figures docs/mlx.md quotes)."""
    runs = {n: np.load(folder / f"{n}.npz") for n in ("store", "reference", "restore", "damaged")}
    reference = runs["reference"]
    print(f"{'run':<10} {'computed':>8}  {'KV == ref':>9}  {'max |dlogit|':>12}  tokens  blocks")
    for name in ("store", "restore", "damaged"):
        run = runs[name]
        same_kv = np.array_equal(run["prefix_kv"], reference["prefix_kv"])
        delta = float(np.abs(run["logits"] - reference["logits"]).max())
        print(
            f"{name:<10} {int(run['first_computed']):>8}  {same_kv!s:>9}  {delta:>12.3g}  "
            f"{run['tokens'].tolist()}  {run['block_table'][:PREFIX_BLOCKS].tolist()}"
        )
    print(f"reference tokens {reference['tokens'].tolist()}")
    mutated = float(np.abs(runs["restore"]["mutated_logits"] - reference["logits"]).max())
    print(f"restore with one prefix key changed by 0.01: max |dlogit| {mutated:.3g}")
    quarantined = sorted(p.name for p in (folder / "disk").rglob("quarantine/*.kvb"))
    print(f"quarantined records: {quarantined}")


def main(phase: str, folder: Path) -> None:
    """``store``: the cold prompt and the reference; ``restore``: the prompt restored in this
    fresh process, then, after its first record was damaged, served by another engine;
    ``report``: the comparison of the two."""
    if phase == "report":
        report(folder)
        return
    from kvtier.bench.models import smollm2

    model_dir = smollm2()
    model, tokenizer = load(str(model_dir))
    if phase == "store":
        serve("store", folder, model_dir, model, tokenizer, other_first=False)
        shape = shape_of(model_dir, num_blocks=PREFIX_BLOCKS + 2)
        np.savez(folder / "reference.npz", **reference(model, shape, prompt_tokens(tokenizer)))
    else:
        serve("restore", folder, model_dir, model, tokenizer, other_first=True)
        first_key = str(np.load(folder / "store.npz")["first_key"])
        damage_first_record(folder / "disk", first_key)
        serve("damaged", folder, model_dir, model, tokenizer, other_first=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
