"""format and store stay engine-agnostic: importing them loads neither vLLM nor torch."""

from __future__ import annotations

import subprocess
import sys


def test_store_import_loads_no_engine_modules() -> None:
    code = (
        "import sys, kvtier.store, kvtier.format\n"
        "heavy = sorted(m for m in ('vllm', 'torch', 'numpy') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    )
    assert result.stdout.strip() == ""
