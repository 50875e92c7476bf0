"""Copy the vLLM 0.25.1 sources kvtier's contract test reads out of the published wheel.

    python tests/vllm_0_25_1/extract.py PATH/vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl

Get the wheel with ``pip download --no-deps --only-binary=:all: --python-version 3.12
--implementation cp --platform manylinux_2_28_x86_64 vllm==0.25.1`` (about 240 MB; keep it out
of the repository). The files are copied unchanged (Apache-2.0, headers kept) with a ``.src``
suffix, so neither pytest nor the linter treats them as this project's code, and
``SHA256SUMS`` records the wheel's and each file's digest. The test checks the copies against
``SHA256SUMS`` always, and against the wheel when one is in the cache
(``${KVTIER_CACHE_DIR:-~/.cache/kvtier}/wheels``).
"""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL_SHA256 = "16fc7a28df1576eb6f7ca0455026551b8f9adb674c19c66059359ef3e964bd1e"
WHEEL_NAME = "vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl"
#: Every module whose interface kvtier relies on (see test_vllm_0_25_1_contract.py).
FILES = (
    "vllm/v1/kv_offload/base.py",
    "vllm/v1/kv_offload/factory.py",
    "vllm/v1/kv_offload/tiering/base.py",
    "vllm/v1/kv_offload/tiering/factory.py",
    "vllm/v1/kv_offload/tiering/spec.py",
    "vllm/v1/kv_offload/tiering/manager.py",
    "vllm/v1/kv_offload/cpu/spec.py",
    "vllm/v1/kv_offload/cpu/shared_offload_region.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/config/cache.py",
    "vllm/config/model.py",
    "vllm/config/vllm.py",
    "vllm/v1/engine/core.py",
    "vllm-0.25.1.dist-info/licenses/LICENSE",
)


def fixture_path(name: str) -> Path:
    return HERE / (name + ".src")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_wheel(wheel: Path) -> dict[str, bytes]:
    digest = sha256(wheel.read_bytes())
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {digest}, expected {WHEEL_SHA256} (vllm==0.25.1)")
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in FILES}


def main(wheel: str) -> None:
    files = read_wheel(Path(wheel))
    lines = [f"{WHEEL_SHA256}  {WHEEL_NAME}"]
    for name, data in files.items():
        path = fixture_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        lines.append(f"{sha256(data)}  {name}")
    (HERE / "SHA256SUMS").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
