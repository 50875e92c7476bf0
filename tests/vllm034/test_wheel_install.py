"""``pip install kvtier`` into an existing vLLM 0.34.0 environment changes nothing of it.

kvtier's wheel, built from this checkout, goes into a venv layered over the vLLM 0.34.0 venv
(``scripts/setup-vllm034.sh``; its site-packages through a ``.pth``, so the cached venv itself
is never written): with ``--no-index``, so every dependency kvtier declares must already be
satisfied there, and nothing is installed but kvtier. Then ``pip check`` says what it said
before (only vLLM's own missing flashinfer-python), no installed version changed, and in a
fresh process without the checkout on the path the installed kvtier builds a config and vLLM
0.34.0's connector scheduler side runs with it. The extras resolve (a dry run against the
package index) without touching vllm or torch.

Runs in the second test environment only (``scripts/test.sh``); skips elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.vllm034 import RELEASE, require_vllm_0_34

require_vllm_0_34()

REPO = Path(__file__).resolve().parents[2]
#: Not part of the source a user builds from: build outputs, caches.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", "build", "dist", "out", "*.egg-info", "__pycache__", ".*_cache", "*.so", ".venv"
)
#: What ``pip check`` says of the vLLM 0.34.0 environment before kvtier is installed.
VLLMS_OWN = [f"vllm {RELEASE} requires flashinfer-python, which is not installed."]
#: pip's words for "no index reachable".
OFFLINE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ProxyError",
)

#: In the layered venv, from outside the checkout: kvtier builds a config, and vLLM 0.34.0's
#: connector scheduler side builds kvtier's spec from it and vLLM's manager behind it.
SCHEDULER_SIDE = """
import json, sys, tempfile, uuid
import torch
import kvtier
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig, OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

init_none_hash(sha256)
config = kvtier.kv_transfer_config(
    host_pool="64MiB", disk_dir=tempfile.mkdtemp(), disk_capacity="64MiB"
)
extra = config["kv_connector_extra_config"]
offloading = OffloadingConfig(
    groups=(OffloadingGroupConfig(16, ("l.0",), 0),),
    worker_kv_bytes_per_block=65536,
    enable_kv_cache_events=False,
    extra_config=extra,
    engine_id=f"kvtier-{uuid.uuid4().hex}",
    model=OffloadingModelConfig(name="m", dtype="float32"),
    cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=8),
    parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True),
)
# No GPU here: vLLM cannot infer the device, so the config names one.
vllm_config = VllmConfig(device_config=DeviceConfig(device="cpu"))
kv_cache = KVCacheConfig(
    num_blocks=64,
    kv_cache_tensors=[],
    kv_cache_groups=[
        KVCacheGroupSpec(
            ["l.0"],
            FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32),
        )
    ],
)
with set_current_vllm_config(vllm_config):
    spec = OffloadingSpecFactory.get_spec_cls(extra)(offloading)
    scheduler = OffloadingConnectorScheduler(spec, vllm_config, kv_cache)
manager = scheduler.manager
print(json.dumps({
    "kvtier": kvtier.__file__,
    "spec": type(spec).__name__,
    "manager": type(manager).__name__,
    "vllm_manager": type(manager.manager).__name__,
    "schedule_end_last": manager.schedule_end_last,
    "tiers": [type(t).__name__ for t in manager.secondary_tiers],
}))
manager.shutdown()
"""


def clean_env() -> dict[str, str]:
    """This environment without the checkout's sources on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run(argv: list[object], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        cwd=cwd,
        env=clean_env(),
    )


def build_wheel(work: Path) -> Path:
    """A wheel of this checkout, built from a copy of its sources (the checkout stays as is)."""
    source = work / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = run([*pip, source, "-w", work / "wheel"], work)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (work / "wheel").glob("kvtier-*.whl")
    return wheel


def layered_venv(work: Path) -> Path:
    """A venv without packages of its own that sees the vLLM 0.34.0 venv's (pip included)."""
    venv = work / "layered"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv], work)
    assert made.returncode == 0, made.stderr[-3000:]
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "vllm034.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def pip_check(python: Path, cwd: Path) -> list[str]:
    return run([python, "-m", "pip", "check"], cwd).stdout.splitlines()


def freeze(python: Path, cwd: Path) -> list[str]:
    listed = run([python, "-m", "pip", "list", "--format=freeze"], cwd)
    assert listed.returncode == 0, listed.stderr[-3000:]
    return sorted(listed.stdout.splitlines())


def test_the_wheel_installs_over_vllm_0_34_0_changing_nothing_and_runs_its_scheduler_side(
    tmp_path,
):
    base = Path(sys.executable)
    before = freeze(base, tmp_path)
    assert pip_check(base, tmp_path) == VLLMS_OWN
    wheel = build_wheel(tmp_path)
    venv = layered_venv(tmp_path)
    python = venv / "bin" / "python"
    installed = run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--no-compile", f"{wheel}[shared]"],
        tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    (site,) = (venv / "lib").glob("python3*/site-packages")
    own = sorted(p.name for p in site.glob("*.dist-info"))
    assert own == [f"kvtier-{wheel.name.split('-')[1]}.dist-info"], "only kvtier was installed"
    assert pip_check(python, tmp_path) == VLLMS_OWN
    after = [line for line in freeze(python, tmp_path) if not line.startswith("kvtier==")]
    assert after == before, "an installed version changed"
    assert freeze(base, tmp_path) == before

    ran = run([python, "-c", SCHEDULER_SIDE], tmp_path, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    # kvtier's own log lines share stdout; the result is the one JSON line.
    (line,) = [x for x in ran.stdout.splitlines() if x.startswith("{")]
    seen = json.loads(line)
    assert seen["kvtier"].startswith(str(site)), "the installed kvtier, not the checkout's"
    assert seen == seen | {
        "spec": "KvtierCudaSpec",
        "manager": "StepTimedManager",
        "vllm_manager": "TieringOffloadingManager",
        "schedule_end_last": True,
        "tiers": ["KvtierDiskTier"],
    }


def test_the_extras_resolve_without_touching_vllm_or_torch(tmp_path):
    """A dry run against the package index: what ``pip install kvtier[...]`` would install
    into the vLLM 0.34.0 environment never includes vllm, torch or their pins."""
    wheel = build_wheel(tmp_path)
    venv = layered_venv(tmp_path)
    report = tmp_path / "report.json"
    resolved = run(
        [
            venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "-q",
            "--dry-run",
            "--report",
            report,
            f"{wheel}[shared,encryption,bench]",
        ],
        tmp_path,
    )
    if resolved.returncode != 0 and any(s in resolved.stderr for s in OFFLINE):
        pytest.skip(f"pip cannot reach a package index: {resolved.stderr.strip()[-300:]}")
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "kvtier" in names
    assert not names & {"vllm", "torch", "torchvision", "torchaudio", "numpy", "pydantic"}, names
