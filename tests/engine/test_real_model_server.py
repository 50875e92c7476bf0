"""SmolLM2-135M behind `kvtier serve`: restores are exact, and SIGTERM leaves nothing in /dev/shm.

vLLM's API server force-kills its EngineCore on SIGTERM, so upstream's region cleanup never runs
there; kvtier must not leak the host pool anyway.
"""

import pytest

from kvtier.bench.harness.server import ServerEngine
from kvtier.demo import build_prompt
from tests.support.regions import regions_left_by

pytestmark = [pytest.mark.engine, pytest.mark.real_model]

FROM_HOST = "vllm:prompt_tokens_cached_by_source{source=host}"
EXTERNAL = "vllm:prompt_tokens_by_source{source=external_kv_transfer}"


@pytest.fixture(scope="module")
def smollm2_dir():
    from tests.support.models import smollm2

    return smollm2()


def test_served_real_model_restores_from_host_pool_and_stops_clean(smollm2_dir, engine_logs):
    prompt = build_prompt(smollm2_dir, 700)  # 5 full blocks and a tail
    server = ServerEngine(
        smollm2_dir,
        engine_logs / "smollm2-server.log",
        host_pool="512MiB",
        max_model_len=2048,
        # evicted by a prefix-cache reset: a pool below the engine's 1 GiB is enough here
        allow_small_tiers=True,
    )
    try:
        server.generate_one(prompt, 24)  # cold
        reference, _ = server.generate_one(prompt, 24)  # engine prefix-cache hit
        assert server.reset_prefix_cache()
        restored, sources = server.measured(prompt, 24, {"host": FROM_HOST, "external": EXTERNAL})
    finally:
        code = server.close()
    assert sources == {"host": 640, "external": 640}
    assert restored.num_cached_tokens == reference.num_cached_tokens == 640
    assert restored.token_ids == reference.token_ids and len(restored.token_ids) == 24
    assert restored.text == reference.text
    assert (restored.text or "").strip(), "the model produced text"
    assert code is not None
    assert regions_left_by(server.log) == set()
