"""The GPU bundle's way to a GPU host, without one: ``split-for-transfer.sh`` cuts a bundle
into the folders that travel one call each, and ``on-host.sh`` stages and unpacks them, over a
bundle of tiny archives shaped like ``build-bundle.sh``'s."""

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
TOOLS = ("split", "sha256sum", "git", "du")
pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in TOOLS), reason=f"needs {', '.join(TOOLS)}"
)


def archive(path: Path, files: dict[str, bytes]) -> bytes:
    with tarfile.open(path, "w:xz") as made:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            made.addfile(info, io.BytesIO(data))
    return path.read_bytes()


def bundle(folder: Path, moe: bool) -> Path:
    """A bundle as ``build-bundle.sh`` leaves it: vLLM's archive in parts, the wheels' and
    kvtier's archives, and with ``moe`` the fused-MoE kernels."""
    folder.mkdir()
    whole = archive(folder / "whole.tar.xz", {"vllm/x.py": b"x = 1\n"})
    (folder / "whole.tar.xz").unlink()
    (folder / "vllm-0.25.1-fa3only.tar.xz.part00").write_bytes(whole[:100])
    (folder / "vllm-0.25.1-fa3only.tar.xz.part01").write_bytes(whole[100:])
    archive(folder / "deps-cp312-site.tar.xz", {"dep/y.py": b"y = 2\n"})
    archive(folder / "kvtier-site.tar.xz", {"kvtier/z.py": b"z = 3\n"})
    if moe:
        archive(folder / "vllm-moe-kernels.tar.xz", {"vllm/_moe_C.so": b"kernels"})
    return folder


def script(tmp_path: Path, name: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVTIER_GPU_ROOT": str(tmp_path / "host"), "OUT": str(tmp_path)}
    return subprocess.run(
        ["bash", str(GPU / name), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def unpacked(tmp_path: Path) -> set[str]:
    site = tmp_path / "host" / "site"
    return {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()}


def test_a_dense_bundle_travels_in_three_folders_and_unpacks_whole(tmp_path):
    cut = script(tmp_path, "split-for-transfer.sh", bundle(tmp_path / "bundle", False), tmp_path)
    assert cut.returncode == 0, cut.stderr
    assert not (tmp_path / "moe").exists()
    assert script(tmp_path, "on-host.sh", "stage", tmp_path / "a").returncode == 0
    assert script(tmp_path, "on-host.sh", "stage", tmp_path / "b").returncode == 0
    done = script(tmp_path, "on-host.sh", "unpack", tmp_path / "c")
    assert done.returncode == 0, done.stdout + done.stderr
    assert unpacked(tmp_path) == {"vllm/x.py", "dep/y.py", "kvtier/z.py"}


def test_a_moe_bundle_needs_its_kernels_staged_before_it_unpacks(tmp_path):
    cut = script(tmp_path, "split-for-transfer.sh", bundle(tmp_path / "bundle", True), tmp_path)
    assert cut.returncode == 0, cut.stderr
    assert [p.name for p in (tmp_path / "moe").iterdir()] == ["vllm-moe-kernels.tar.xz"]
    assert script(tmp_path, "on-host.sh", "stage", tmp_path / "a").returncode == 0
    assert script(tmp_path, "on-host.sh", "stage", tmp_path / "b").returncode == 0
    refused = script(tmp_path, "on-host.sh", "unpack", tmp_path / "c")
    assert refused.returncode == 2, "the kernels the bundle names were not staged"
    assert "vllm-moe-kernels.tar.xz" in refused.stdout + refused.stderr
    assert script(tmp_path, "on-host.sh", "stage", tmp_path / "moe").returncode == 0
    done = script(tmp_path, "on-host.sh", "unpack", tmp_path / "c")
    assert done.returncode == 0, done.stdout + done.stderr
    assert unpacked(tmp_path) == {"vllm/x.py", "vllm/_moe_C.so", "dep/y.py", "kvtier/z.py"}
