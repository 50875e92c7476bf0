"""vLLM's real scheduler and offloading connector around a stub model runner that owns an MLX
paged KV cache: the MLX worker driven through vLLM's own job flow, without a model.

``StubEngine`` builds vLLM's ``Scheduler`` (whose connector builds ``KvtierMlxSpec``'s scheduler
side: host pool index, kvtier's tiers) and a worker-side ``KvtierMlxConnector`` that registers an
MLX cache. Each step the stub runner does what a model runner does with a connector: bind the
step's metadata, start loads, "run the model", hand stores over, report finished jobs and the
worker's metadata back to the scheduler.

The stub "model" writes, for every token it computes, KV that is a function of the token and
its position only (``expected_kv``), and before every step checks that the KV of every token
the scheduler says is already computed is exactly that function. A prefix the connector
restored is then checked element by element in the blocks vLLM chose for it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
import torch
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvtier.vllm.mlx_connector import KvtierMlxConnector
from tests.mlx.paged_caches import CacheShape, make_cache

VOCAB = 1000
EOS = VOCAB - 1


def expected_kv(layer: int, tokens: np.ndarray, positions: np.ndarray, shape: CacheShape):
    """The stub model's keys and values ``[n, kv_heads, head_dim]`` for these tokens."""
    width = shape.kv_heads * shape.head_dim
    lanes = np.arange(width, dtype=np.float64) / width
    base = (tokens * 7 + positions * 3 + layer * 11).astype(np.float64)[:, None]
    keys = np.sin(base + lanes) * 4
    values = np.cos(base * 0.5 + lanes) * 4
    dims = (len(tokens), shape.kv_heads, shape.head_dim)
    return mx.array(keys.reshape(dims), dtype=shape.dtype), mx.array(
        values.reshape(dims), dtype=shape.dtype
    )


def model_folder(folder: Path, shape: CacheShape) -> Path:
    """A model folder vLLM's config accepts (config.json only: nothing loads weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    heads = shape.kv_heads * 2
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": heads * shape.head_dim,
        "intermediate_size": 128,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


class KVMismatch(AssertionError):
    """A computed token's KV in the cache is not what the stub model wrote for it."""


@dataclass
class RequestState:
    tokens: list[int]
    prompt_len: int
    block_table: list[int] = field(default_factory=list)
    computed: int = 0


class StubEngine:
    """One engine: vLLM's scheduler, kvtier's MLX connector (worker side), an MLX cache."""

    def __init__(self, model: Path, layout: str, shape: CacheShape, transfer: dict) -> None:
        self.shape = shape
        self.layout = layout
        layers = [f"model.layers.{i}.self_attn.attn" for i in range(shape.num_layers)]
        torch_dtype = {
            mx.float32: torch.float32,
            mx.float16: torch.float16,
            mx.bfloat16: torch.bfloat16,
        }[shape.dtype]
        spec = FullAttentionSpec(
            block_size=shape.block_size,
            num_kv_heads=shape.kv_heads,
            head_size=shape.head_dim,
            dtype=torch_dtype,
        )
        page = spec.page_size_bytes
        self.kv_cache_config = KVCacheConfig(
            num_blocks=shape.num_blocks,
            # One allocation, layer-outermost (vLLM's placement record of it).
            kv_cache_tensors=[
                KVCacheTensor(
                    page * shape.num_blocks * len(layers), layers, page * shape.num_blocks, page
                )
            ],
            kv_cache_groups=[KVCacheGroupSpec(layers, spec)],
        )
        self.vllm_config = VllmConfig(
            model_config=ModelConfig(
                model=str(model), skip_tokenizer_init=True, dtype="float32", max_model_len=2048
            ),
            cache_config=CacheConfig(block_size=shape.block_size, enable_prefix_caching=True),
            scheduler_config=SchedulerConfig(
                max_num_batched_tokens=2048,
                max_num_seqs=8,
                max_model_len=2048,
                is_encoder_decoder=False,
            ),
            kv_transfer_config=KVTransferConfig(**transfer),
        )
        self.vllm_config.cache_config.num_gpu_blocks = shape.num_blocks
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(shape.block_size, sha256)
        self.cache = make_cache(layout, shape)
        # Workers register before the scheduler exists, as in vLLM: the pool file is theirs.
        self.connector = KvtierMlxConnector(
            self.vllm_config, KVConnectorRole.WORKER, self.kv_cache_config
        )
        self.connector.register_kv_caches(self.cache)
        self.scheduler = Scheduler(
            self.vllm_config,
            self.kv_cache_config,
            StructuredOutputManager(self.vllm_config),
            block_size=shape.block_size,
        )
        self.requests: dict[str, RequestState] = {}
        self.added: list[str] = []
        #: The block hash of each request's first block (the key of its first record).
        self.first_block_hash: dict[str, bytes] = {}
        #: The block table each finished request had.
        self.block_tables: dict[str, list[int]] = {}
        self.finished: dict[str, list[int]] = {}
        #: Tokens vLLM reported already computed when it first scheduled a request.
        self.first_computed: dict[str, int] = {}
        self.loads = 0
        self.stores = 0

    @property
    def worker(self):
        return self.connector.connector_worker.worker

    def add(self, request_id: str, prompt: list[int], max_tokens: int = 3) -> None:
        request = Request(
            request_id,
            prompt,
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            None,
            block_hasher=self.hasher,
        )
        self.scheduler.add_request(request)
        self.added.append(request_id)
        self.first_block_hash[request_id] = bytes(request.block_hashes[0])

    def step(self) -> bool:
        """One engine step; whether any token was computed."""
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        self.loads += len(getattr(meta, "load_jobs", {}) or {})
        self.stores += len(getattr(meta, "store_jobs", {}) or {})
        connector = self.connector
        connector.handle_preemptions(meta)
        connector.bind_connector_metadata(meta)
        connector.start_load_kv(None)
        for new in out.scheduled_new_reqs:
            self.requests[new.req_id] = RequestState(
                list(new.prompt_token_ids),
                len(new.prompt_token_ids),
                list(new.block_ids[0]),
                new.num_computed_tokens,
            )
            self.first_computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            if cached.new_block_ids[i] is not None:
                state.block_table += list(cached.new_block_ids[i][0])
            state.computed = cached.num_computed_tokens[i]
        sampled: dict[str, list[int]] = {}
        for req_id, count in out.num_scheduled_tokens.items():
            state = self.requests[req_id]
            self.check_computed(req_id, state)
            positions = np.arange(state.computed, state.computed + count)
            token = self.forward(req_id, state, positions)
            state.computed += count
            if state.computed >= len(state.tokens):
                state.tokens.append(token)
                sampled[req_id] = [token]
            else:
                sampled[req_id] = []
        connector.wait_for_save()
        results = connector.get_transfer_results(out.finished_req_ids)
        kv_output = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            kv_connector_worker_meta=connector.build_connector_worker_meta(),
        )
        connector.clear_connector_metadata()
        req_ids = list(out.num_scheduled_tokens)
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[sampled[r] for r in req_ids],
            kv_connector_output=kv_output,
        )
        engine_outputs = self.scheduler.update_from_output(out, runner_output)
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                if output.finish_reason is not None:
                    state = self.requests.pop(output.request_id)
                    self.finished[output.request_id] = state.tokens[state.prompt_len :]
                    self.block_tables[output.request_id] = state.block_table
        return out.total_num_scheduled_tokens > 0

    def forward(self, req_id: str, state: RequestState, positions: np.ndarray) -> int:
        """Compute the KV of the tokens at ``positions`` into the cache; the next token."""
        tokens = np.asarray(state.tokens)[positions]
        for layer in range(self.shape.num_layers):
            k, v = expected_kv(layer, tokens, positions, self.shape)
            self.cache.write(layer, state.block_table, positions, k, v)
        return int((state.tokens[-1] * 31 + positions[-1] + 1) % (VOCAB - 1))

    def check_computed(self, req_id: str, state: RequestState) -> None:
        """Every computed token's KV, as the engine's attention would read it, is exact."""
        if state.computed == 0:
            return
        positions = np.arange(state.computed)
        tokens = np.asarray(state.tokens)[positions]
        for layer in range(self.shape.num_layers):
            k, v = self.cache.read(layer, state.block_table, positions)
            want_k, want_v = expected_kv(layer, tokens, positions, self.shape)
            for got, want, name in ((k, want_k, "keys"), (v, want_v, "values")):
                bad = np.flatnonzero(~np.asarray(mx.all(got == want, axis=(1, 2))))
                if len(bad):
                    raise KVMismatch(
                        f"request {req_id}: layer {layer} {name} of positions "
                        f"{bad[:8].tolist()} differ from what was computed"
                    )

    def run(self, timeout_s: float = 60.0) -> None:
        """Steps until every added request finished, then a few more so that the stores vLLM
        defers to the next step are submitted and reported."""
        deadline = time.monotonic() + timeout_s
        while set(self.added) - set(self.finished):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"requests {sorted(set(self.added) - set(self.finished))} "
                    f"did not finish in {timeout_s} s"
                )
            if not self.step():
                time.sleep(0.01)  # a lookup waits on a tier (the disk tier opens in the background)
        for _ in range(4):
            self.step()

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        self.connector.shutdown()
