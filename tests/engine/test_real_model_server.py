"""SmolLM2-135M behind `kvtier serve`: restores are exact, and SIGTERM leaves nothing in /dev/shm.

vLLM's API server force-kills its EngineCore on SIGTERM, so upstream's region cleanup never runs
there; kvtier must not leak the host pool anyway.
"""

import pytest

from kvtier.devtools.demo import build_prompt
from kvtier.devtools.harness.server import ServerProcess
from kvtier.vllm.regions import SHM_DIR

pytestmark = [pytest.mark.engine, pytest.mark.real_model]

FROM_HOST = "vllm:prompt_tokens_cached_by_source{source=host}"
EXTERNAL = "vllm:prompt_tokens_by_source{source=external_kv_transfer}"


@pytest.fixture(scope="module")
def smollm2_dir():
    from kvtier.devtools.models import smollm2

    return smollm2()


def test_served_real_model_restores_from_host_pool_and_stops_clean(smollm2_dir, engine_logs):
    prompt = build_prompt(smollm2_dir, 700)  # 5 full blocks and a tail
    server = ServerProcess(
        smollm2_dir,
        engine_logs / "smollm2-server.log",
        host_pool="512MiB",
        max_model_len=2048,
        # evicted by a prefix-cache reset: a pool below the engine's 1 GiB is enough here
        allow_small_tiers=True,
    )
    try:
        client = server.client
        client.complete_stream(prompt, 24)  # cold
        reference = client.complete_stream(prompt, 24)  # engine prefix-cache hit
        client.reset_prefix_cache()
        before = client.metrics()
        restored = client.complete_stream(prompt, 24)
        after = client.metrics()
    finally:
        code = server.stop()
    assert after[FROM_HOST] - before.get(FROM_HOST, 0) == 640
    assert after[EXTERNAL] - before.get(EXTERNAL, 0) == 640
    assert restored.text == reference.text
    assert restored.text.strip(), "the model produced text"
    assert code is not None
    assert list(SHM_DIR.glob("vllm_offload_*")) == []
