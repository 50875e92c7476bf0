"""Tiny random-weight models for tests and the lab's benchmarks, built offline.

* ``tiny_llama()``: a random-weight Llama small enough that an engine starts and prefills in
  seconds, for tests that need real engine behaviour but not real text.
* ``tiny_model(arch)``: the same for every architecture family kvtier is tested on
  (``TINY_ARCHS``: Llama, Qwen2, Qwen3, Gemma 2 and Gemma 3 with sliding-window layers,
  mixture-of-experts Qwen3-MoE and Mixtral, and the Mamba/attention hybrid Jamba).

The real small model (SmolLM2) is ``kvtier.bench.models.smollm2``, re-exported here.
"""

import json
import tempfile
from pathlib import Path

from kvtier.bench.models import ensure_dir, publish_build, smollm2
from kvtier.paths import cache_dir

__all__ = ["TINY_ARCHS", "TINY_LLAMA_CONFIG", "smollm2", "tiny_llama", "tiny_model"]

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


# Overrides per family on top of the Llama shape above (same width, depth, heads, vocab), so
# every family is equally cheap and the differences are only what makes the family itself:
# QK-norm (Qwen3), sliding-window layers (Gemma 2: alternating; Gemma 3: 3 local, 1 global),
# experts (Qwen3-MoE, Mixtral). A 256-token window is two 128-token blocks, so a few-block
# prompt already runs past it.
_BASE = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k not in ("architectures", "model_type")}
TINY_ARCHS: dict[str, dict[str, object]] = {
    "llama": {"model_type": "llama"},
    "qwen2": {"model_type": "qwen2", "use_sliding_window": False},
    "qwen3": {"model_type": "qwen3"},
    "gemma2": {
        "model_type": "gemma2",
        "sliding_window": 256,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        # Final-logit soft-capping squashes the large logits of scaled random weights into
        # near-ties; attention soft-capping (kept) is what the family exercises.
        "final_logit_softcapping": None,
        "query_pre_attn_scalar": 32,
        # vLLM's Gemma 2 always ties embeddings; scaled up, tied embeddings under Gemma's input
        # scaling make greedy decoding repeat one token, so they keep their initial scale.
        "_embedding_scale": 1.0,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "sliding_window": 256,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "query_pre_attn_scalar": 32,
        # Tied embeddings under Gemma's input scaling make greedy decoding repeat one token.
        "tie_word_embeddings": False,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "mixtral": {
        "model_type": "mixtral",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": None,
    },
    # Hybrid: Mamba layers (recurrent state, not per-token KV) between attention layers.
    "jamba": {
        "model_type": "jamba",
        "num_experts": 1,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "use_mamba_kernels": False,
    },
}


def tiny_llama(seed: int = 0, kv_heads: int | None = None) -> Path:
    """A random-weight 4-layer Llama (vocab 2048, no tokenizer: drive it with token ids).

    ``kv_heads``: another number of KV heads than the default 2 (1: every tensor-parallel
    rank holds the same head)."""
    if kv_heads is None:
        return tiny_model("llama", seed)
    return tiny_model("llama", seed, {"num_key_value_heads": kv_heads}, f"kv{kv_heads}")


def tiny_model(
    arch: str, seed: int = 0, overrides: dict[str, object] | None = None, variant: str = ""
) -> Path:
    """A random-weight 4-layer model of family ``arch`` (one of ``TINY_ARCHS``), cached.

    Vocab 2048 and no tokenizer: drive it with token ids. Weights are scaled so greedy decoding
    has real margins (see below). ``overrides`` change the family's config; ``variant`` names
    them in the cached folder's name.
    """
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny model family {arch!r}; known: {sorted(TINY_ARCHS)}")
    if bool(overrides) != bool(variant):
        raise ValueError("tiny_model: give overrides and the variant that names them together")
    suffix = f"-{variant}" if variant else ""
    final = cache_dir() / "models" / f"tiny-{arch.replace('_', '-')}{suffix}-s{seed}"
    if (final / ".complete").exists():
        return final
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    overrides = {**TINY_ARCHS[arch], **(overrides or {})}
    model_type = str(overrides.pop("model_type"))
    embedding_scale = float(overrides.pop("_embedding_scale", 10.0))  # type: ignore[arg-type]
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**_BASE, **overrides})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init is tiny (std 0.02); scale it so logits have real margins and greedy decoding
    # is a meaningful oracle rather than a tie-break over near-equal scores.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim > 1:
                param.mul_(embedding_scale if "embed" in name else 10.0)
    build = Path(tempfile.mkdtemp(prefix=".tiny-", dir=ensure_dir(final.parent)))
    model.save_pretrained(build)
    (build / "kvtier_model.json").write_text(
        json.dumps({"arch": arch, "seed": seed, "random_weights": True})
    )
    (build / ".complete").touch()
    publish_build(build, final)
    return final
