"""Blocks across tensor-parallel sizes of unequal head slices, on the disk and shared tiers.

vLLM's tier-agnostic case ``fs_tier_cross_tp_round_trip`` (a TP=2 writer's block, a TP=4
reader) as a behaviour of kvtier's tiers, with its mirror (TP=4 written, TP=2 read): a model
of four KV heads in vLLM's CPU layout (``LBHNC``: each page is its heads one after another), so
every rank's part of a row is known head by head. A reader's row must hold, rank by rank, the
heads that rank serves, whatever TP size wrote the block; a damaged head is a miss of the whole
block; a layout whose heads cannot be placed crosses nothing (a clean miss).
"""

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

from kvtier.format import HEADER_BYTES
from kvtier.runtime.row_layout import head_major_units
from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.engine_namespace import build_namespace, engine_row_layout
from kvtier.vllm.shared_tier import KvtierSharedTier
from kvtier.vllm.store_tier import StoreTier
from tests.support.fake_remote import FakeRemoteStore
from tests.support.redis_servers import RedisServer, server_binary, start_standalone
from tests.vllm.test_disk_tier import run

KV_HEADS, LAYERS, TOKENS, HEAD_SIZE, ELEMENT = 4, 2, 16, 32, 4
#: One head's KV of one layer and block: tokens x (K|V) x head size x float32.
HEAD_BYTES = TOKENS * 2 * HEAD_SIZE * ELEMENT
PAGE = 4096
CTX = ReqContext(req_id="r")
KEY = b"\x07" * 32 + (0).to_bytes(4, "big")


@pytest.fixture(autouse=True)
def seeded_hashes():
    init_none_hash(sha256)


def model_dir(root: Path, kv_heads: int = KV_HEADS, latent: bool = False) -> Path:
    folder = root / f"model-{kv_heads}{'-mla' if latent else ''}"
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "head_dim": HEAD_SIZE,
    }
    if latent:
        config["kv_lora_rank"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def heads_per_rank(tp: int, kv_heads: int = KV_HEADS) -> int:
    return max(1, kv_heads // tp)


def engine_config(
    model: Path, tp: int, kv_heads: int = KV_HEADS, layout: str | None = "LBHNC"
) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(TOKENS, tuple(f"layer.{i}" for i in range(LAYERS)), 0),),
        worker_kv_bytes_per_block=LAYERS * heads_per_rank(tp, kv_heads) * HEAD_BYTES,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="test",
        model=OffloadingModelConfig(name=str(model), dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(0, tp, tp, 1, 1, 1, 0, 1, None, False),
        kv_cache_layout=layout,
    )


def row_bytes(config: OffloadingConfig, replicated: bool = False) -> int:
    copies = 1 if replicated else config.parallel.world_size
    return -(-copies * config.worker_kv_bytes_per_block // PAGE) * PAGE


def head_kv(layer: int, head: int) -> np.ndarray:
    """One head's KV of one layer of the block: distinct bytes for every (layer, head)."""
    return np.random.default_rng(1000 * layer + head).integers(-128, 128, HEAD_BYTES, dtype=np.int8)


def engine_row(tp: int, kv_heads: int = KV_HEADS) -> np.ndarray:
    """The row a TP=``tp`` engine's workers fill: rank by rank, each layer's page its heads."""
    parts = []
    for rank in range(tp):
        if kv_heads >= tp:
            heads = range(rank * kv_heads // tp, (rank + 1) * kv_heads // tp)
        else:
            heads = [rank * kv_heads // tp]  # replicated: vLLM's rank -> head
        parts += [head_kv(layer, head) for layer in range(LAYERS) for head in heads]
    return np.concatenate(parts)


class Server(FakeRemoteStore):
    """A fake server that outlives the tiers that use it (a tier's shutdown closes its store)."""

    def close(self) -> None:
        pass


class Tiers:
    """Tiers of several TP sizes on one disk folder, on one Redis server, or on one fake server
    per namespace (as the shared store keys records by namespace)."""

    def __init__(self, root: Path, kind: str) -> None:
        self.root, self.kind = root, kind
        self.servers: dict[bytes, Server] = {}
        self.made: list = []
        self.redis: RedisServer | None = None
        if kind == "redis":
            if server_binary() is None:
                pytest.skip("no redis-server on PATH (run scripts/redis-server.sh)")
            self.redis = start_standalone(root / "redis")

    def server(self, settings, namespace) -> Server:
        server = self.servers.setdefault(namespace.digest(), Server())
        server.view.clear()  # a fresh engine has seen none of the server's keys: it asks
        return server

    def open(self, config: OffloadingConfig, rows: int = 4, replicated: bool = False):
        pool = np.zeros((rows, row_bytes(config, replicated)), dtype=np.int8)
        spec = SimpleNamespace(config=config, replicated_layout=replicated)
        if self.kind == "disk":
            tier = KvtierDiskTier(
                spec, memoryview(pool), "t", root_dir=str(self.root / "disk"),
                capacity_bytes="16MiB",
            )  # fmt: skip
        elif self.redis is not None:
            tier = KvtierSharedTier(spec, memoryview(pool), "t", url=self.redis.url)
        else:
            tier = KvtierSharedTier(
                spec, memoryview(pool), "t", url="redis://127.0.0.1:1",
                store_factory=self.server, check=lambda s, r: None,
            )  # fmt: skip
        self.made.append(tier)
        deadline = time.monotonic() + 30
        while tier.store is None:
            assert time.monotonic() < deadline, "the store did not open"
            time.sleep(0.01)
        return tier, pool

    def close(self) -> None:
        for tier in self.made:
            tier.shutdown()
        if self.redis is not None:
            self.redis.kill()


@pytest.fixture(params=["disk", "shared", "redis"])
def tiers(request, tmp_path):
    made = Tiers(tmp_path, request.param)
    yield made
    made.close()


def lookup(tier, key: bytes = KEY) -> LookupResult:
    """The tier's verdict once it stopped asking (a shared tier asks the server: RETRY)."""
    deadline = time.monotonic() + 30
    while (verdict := tier.lookup(key, CTX)) is LookupResult.RETRY:
        assert time.monotonic() < deadline, "still RETRY"
        time.sleep(0.01)
    return verdict


def write_block(tiers: Tiers, model: Path, tp: int) -> None:
    writer, pool = tiers.open(engine_config(model, tp))
    used = engine_row(tp)
    pool[0, : used.size] = used
    assert run(writer, 1, [KEY], [0], False).success
    writer.shutdown()


def read_block(tiers: Tiers, model: Path, tp: int):
    """A fresh TP=``tp`` tier's lookup and load of KEY into row 2: (result, its row)."""
    reader, pool = tiers.open(engine_config(model, tp))
    assert lookup(reader) is LookupResult.HIT
    result = run(reader, 2, [KEY], [2], True)
    return result, pool[2, : engine_row(tp).size]


# -- vLLM's tier-agnostic case and its mirror ------------------------------------------------
@pytest.mark.parametrize(("written", "read"), [(2, 4), (4, 2), (2, 1), (1, 4), (4, 1)])
def test_fs_tier_cross_tp_round_trip(tiers, tmp_path, written, read):
    """A block a TP=``written`` engine stored loads into a TP=``read`` engine's row, every
    rank holding its own heads (TP=2 -> TP=4: a rank's head out of a part that held two;
    TP=4 -> TP=2: a rank's two heads from two parts)."""
    model = model_dir(tmp_path)
    write_block(tiers, model, written)
    result, row = read_block(tiers, model, read)
    assert result.success
    assert np.array_equal(row, engine_row(read))
    assert result.transfer_bytes == KV_HEADS * LAYERS * HEAD_BYTES, "every head, read once"


def test_replicated_heads_cross_to_a_tp_size_that_splits_them(tiers, tmp_path):
    """Two KV heads at TP=4 (two ranks a head, one copy kept) load into TP=1's one page."""
    model = model_dir(tmp_path, kv_heads=2)
    writer, pool = tiers.open(engine_config(model, 4, kv_heads=2))
    pool[0, : engine_row(4, 2).size] = engine_row(4, 2)
    assert run(writer, 1, [KEY], [0], False).success
    writer.shutdown()
    reader, pool1 = tiers.open(engine_config(model, 1, kv_heads=2))
    assert lookup(reader) is LookupResult.HIT
    assert run(reader, 2, [KEY], [1], True).success
    assert np.array_equal(pool1[1, : engine_row(1, 2).size], engine_row(1, 2))


def test_a_single_copy_latent_crosses_tp_sizes(tiers, tmp_path):
    """vLLM's literal case: an MLA latent, one copy of it kept by a TP=2 writer (replicated
    layout), read by a TP=4 reader that keeps one copy too."""
    model = model_dir(tmp_path, kv_heads=1, latent=True)
    writer, pool = tiers.open(engine_config(model, 2, kv_heads=1), replicated=True)
    latent = np.arange(pool.shape[1], dtype=np.int64).astype(np.int8)
    pool[0] = latent
    assert run(writer, 1, [KEY], [0], False).success
    writer.shutdown()
    reader, pool4 = tiers.open(engine_config(model, 4, kv_heads=1), replicated=True)
    assert lookup(reader) is LookupResult.HIT
    assert run(reader, 2, [KEY], [3], True).success
    assert np.array_equal(pool4[3], latent)


# -- misses --------------------------------------------------------------------------------
def hold_idle_probes(monkeypatch) -> None:
    """A fresh tier's housekeeping reads one stored record to measure the tier (off any
    request's path), which would find the damaged record before the request does."""
    monkeypatch.setattr(StoreTier, "_measure_idle_tier", lambda tier, store: None)


def test_a_damaged_head_makes_the_whole_block_a_miss(tmp_path, monkeypatch):
    """One flipped byte in head 3 (all a TP=4 reader's rank 3 reads): no rank gets the block."""
    hold_idle_probes(monkeypatch)
    tiers = Tiers(tmp_path, "disk")
    model = model_dir(tmp_path)
    try:
        write_block(tiers, model, 2)
        (record,) = (tmp_path / "disk").glob("*/blocks/*/*.kvb")
        data = bytearray(record.read_bytes())
        data[HEADER_BYTES + 3 * HEAD_BYTES + 5] ^= 0x40  # head 3 of layer 0
        record.write_bytes(bytes(data))
        reader, pool = tiers.open(engine_config(model, 4))
        assert lookup(reader) is LookupResult.HIT
        result = run(reader, 2, [KEY], [2], True)
        assert not result.success and not result.successful_keys
        assert not pool[2].any(), "no rank's part was written"
        assert lookup(reader) is LookupResult.MISS, "and it is not offered again"
    finally:
        tiers.close()


def test_a_damaged_head_on_the_server_makes_the_whole_block_a_miss(tmp_path, monkeypatch):
    """The same on the shared tier: the value is the record, one byte of head 3 flipped."""
    hold_idle_probes(monkeypatch)
    tiers = Tiers(tmp_path, "redis")
    model = model_dir(tmp_path)
    try:
        write_block(tiers, model, 2)
        assert tiers.redis is not None
        import redis  # the [shared] extra, installed wherever a server is

        client = redis.Redis.from_url(tiers.redis.url)
        (value_key,) = [k for k in client.keys("kvt:*") if k.endswith(KEY.hex().encode())]
        offset = HEADER_BYTES + 3 * HEAD_BYTES + 5
        byte = client.getrange(value_key, offset, offset)[0]
        client.setrange(value_key, offset, bytes([byte ^ 0x40]))
        client.close()
        reader, pool = tiers.open(engine_config(model, 4))
        assert lookup(reader) is LookupResult.HIT
        result = run(reader, 2, [KEY], [2], True)
        assert not result.success and not result.successful_keys
        assert not pool[2].any(), "no rank's part was written"
        assert lookup(reader) is LookupResult.MISS, "and it is not offered again"
    finally:
        tiers.close()


def test_a_block_missing_from_the_tier_is_a_miss_for_every_tp_size(tiers, tmp_path):
    model = model_dir(tmp_path)
    write_block(tiers, model, 2)
    other = b"\x08" * 32 + (0).to_bytes(4, "big")
    for tp in (1, 4):
        reader, _ = tiers.open(engine_config(model, tp))
        assert lookup(reader, other) is LookupResult.MISS


def test_heads_that_cannot_be_placed_cross_nothing(tiers, tmp_path):
    """Without a head-major layout the record is the slices one after another, named by
    them: another TP size's lookup is a clean miss, never a wrong row."""
    model = model_dir(tmp_path)
    writer, pool = tiers.open(engine_config(model, 2, layout=None))
    pool[0, : engine_row(2).size] = engine_row(2)
    assert run(writer, 1, [KEY], [0], False).success
    writer.shutdown()
    reader, _ = tiers.open(engine_config(model, 4, layout=None))
    assert lookup(reader) is LookupResult.MISS


# -- the namespace and the layout --------------------------------------------------------------
def namespace(config: OffloadingConfig):
    return build_namespace(config, engine_row_layout(config, False, row_bytes(config)))


def test_every_tp_size_shares_the_tp1_engines_namespace(tmp_path):
    model = model_dir(tmp_path)
    names = [namespace(engine_config(model, tp)) for tp in (1, 2, 4)]
    assert names[0] == names[1] == names[2]
    assert names[0].extra["kv_slices"] == "kv heads 0-4 of 4"
    assert names[0].extra["worker_kv_bytes_per_block"] == str(KV_HEADS * LAYERS * HEAD_BYTES)


def test_a_tp1_record_is_its_row_and_other_tp_sizes_interleave(tmp_path):
    model = model_dir(tmp_path)
    configs = {tp: engine_config(model, tp) for tp in (1, 2, 4)}
    layouts = {tp: engine_row_layout(c, False, row_bytes(c)) for tp, c in configs.items()}
    assert layouts[1].is_prefix and not layouts[1].interleaved
    assert layouts[2].interleaved and layouts[4].interleaved
    assert {layout.record_bytes for layout in layouts.values()} == {KV_HEADS * LAYERS * HEAD_BYTES}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"kv_cache_layout": "LBNHC"}, "a page token-major: heads interleaved per token"),
        ({"dtype": "complex64"}, "an element size not known"),
        ({"tokens_per_block": [16, 32]}, "groups of different block sizes"),
        ({"worker_bytes_per_block": LAYERS * 2 * HEAD_BYTES + 64}, "padded pages"),
    ],
)
def test_head_major_pieces_are_placed_only_where_proven(change, why):
    args = {
        "kv_cache_layout": "LBHNC",
        "dtype": "float32",
        "tokens_per_block": [TOKENS],
        "layers": LAYERS,
        "kv_heads": KV_HEADS,
        "head_size": HEAD_SIZE,
        "tp_size": 2,
        "worker_bytes_per_block": LAYERS * 2 * HEAD_BYTES,
        "blocks_per_chunk": 2,
    }
    assert head_major_units(**args) == LAYERS * 2
    assert head_major_units(**{**args, **change}) == 0, why
