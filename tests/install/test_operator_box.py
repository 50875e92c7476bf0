"""An operator box: ``pip install kvtier`` in a venv without vLLM runs the operator commands.

The wheel is built from this checkout and installed with the dependencies pyproject.toml
declares, fetched by pip from the package index, into a venv made with ``python3.11 -m venv``
(no vLLM, no torch, no extras). In it: DiskStore writes a folder (the store needs no engine),
``kvtier ls / du / verify / gc`` read it, ``kvtier stats`` reads a loopback server's
``/metrics``, and the commands that need an extra say which one in one line.

The venv holding the dependencies is cached (kvtier's cache folder), keyed on the Python
version and the declared base dependencies: a dependency added to or dropped from pyproject
gets a fresh venv, so a module the code imports without declaring it still fails here. kvtier
itself is reinstalled from a fresh wheel on every run. Skipped, with the reason, when pip
cannot reach a package index.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtier.cli.main import app
from kvtier.extras import ALTERNATIVES
from kvtier.paths import cache_dir

REPO = Path(__file__).resolve().parents[2]
PYTHON = "python3.11"
#: pip's words for "no index reachable" (not "no version fits", which is a real failure).
OFFLINE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ProxyError",
)
#: Not part of the sdist a user builds: build outputs, caches, reports.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", "build", "dist", "out", "*.egg-info", "__pycache__", ".*_cache", "*.so", ".venv"
)


def box_env(**extra: str) -> dict[str, str]:
    """This environment without PYTHONPATH: the box must not see the checkout's sources (pip
    would even count kvtier as installed from them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


def run(argv: list[object], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=box_env(COLUMNS="200"),
    )


def venv_key() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [sys.version_info[:2], project["requires-python"], sorted(project["dependencies"])]
    return hashlib.sha256(json.dumps(declared).encode()).hexdigest()[:16]


def build_wheel(work: Path) -> Path:
    """A wheel of this checkout, built from a copy of its sources (the checkout stays as is)."""
    source = work / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = run([*pip, source, "-w", work / "wheel"], timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (work / "wheel").glob("kvtier-*.whl")
    return wheel


def install(venv: Path, wheel: Path) -> None:
    """kvtier into ``venv``: with its dependencies the first time, alone after that."""
    fresh = not (venv / ".complete").exists()
    if fresh:
        shutil.rmtree(venv, ignore_errors=True)
        made = run([PYTHON, "-m", "venv", venv], timeout=120)
        assert made.returncode == 0, made.stderr[-3000:]
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
    if not fresh:
        pip += ["--no-deps", "--force-reinstall"]
    done = run([*pip, wheel], timeout=600)
    if done.returncode != 0 and any(s in done.stderr for s in OFFLINE):
        pytest.skip(f"pip cannot reach a package index: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    (venv / ".complete").touch()


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if shutil.which(PYTHON) is None:
        pytest.skip(f"{PYTHON} is not on PATH")
    wheel = build_wheel(tmp_path_factory.mktemp("operator-box"))
    folder = cache_dir() / "operator-venvs"
    folder.mkdir(parents=True, exist_ok=True)
    # One run at a time per venv: a second one would reinstall kvtier under the first.
    with open(folder / f"{venv_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = folder / venv_key()
        install(path, wheel)
        yield path


def kvtier_in(venv: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return run([venv / "bin" / "kvtier", *args], timeout=120)


WRITE_STORE = """
import sys
from pathlib import Path
from kvtier.format import Namespace
from kvtier.store import DiskStore

namespace = Namespace(
    model="org/model", weights_fingerprint="sha256:feed", kv_dtype="float32",
    block_size_tokens=16, num_groups=1, num_layers=2, num_kv_heads=2, head_size=64,
    block_bytes=8192, hash_algorithm="sha256_cbor",
)
store = DiskStore(Path(sys.argv[1]), namespace, 64 * 2**20, 0)
for i in range(int(sys.argv[2])):
    key = i.to_bytes(32, "big") + (0).to_bytes(4, "big")
    assert store.put(key, bytes([i]) * 8192)
store.close()
print(namespace.digest_hex())
"""


def test_the_box_has_neither_vllm_nor_torch_nor_any_extra(venv: Path) -> None:
    probe = "import importlib.util as u, json; print(json.dumps([m for m in %r if u.find_spec(m)]))"
    modules = ("vllm", "torch", "redis", "hiredis", "matplotlib", "psutil", "gguf")
    done = run([venv / "bin" / "python", "-c", probe % (modules,)], timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_ls_du_verify_gc_read_a_folder_the_store_wrote(venv: Path, tmp_path: Path) -> None:
    root = tmp_path / "kv"
    written = run([venv / "bin" / "python", "-c", WRITE_STORE, root, 5], timeout=60)
    assert written.returncode == 0, written.stderr[-3000:]
    digest = written.stdout.strip()

    ls = kvtier_in(venv, "ls", root, "--json")
    assert ls.returncode == 0, ls.stderr
    (row,) = json.loads(ls.stdout)["namespaces"]
    assert (row["namespace"], row["model"], row["blocks"]) == (digest, "org/model", 5)

    du = kvtier_in(venv, "du", root, "--json")
    assert du.returncode == 0, du.stderr
    assert json.loads(du.stdout)["used_bytes"] == row["bytes"]

    verify = kvtier_in(venv, "verify", root)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    gc = kvtier_in(venv, "gc", root, "--older-than", "0s", "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["records"] == 5
    after = json.loads(kvtier_in(venv, "ls", root, "--json").stdout)["namespaces"]
    assert [n["blocks"] for n in after] in ([], [0])


@contextmanager
def served_by(text: str) -> Iterator[str]:
    """A loopback HTTP server answering GET /metrics with ``text``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def exposition() -> str:
    """A vLLM server's /metrics with two tiers' lookups and restored tokens (prometheus_client's
    own text format, as a server writes it)."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    tier = ("engine", "model_name", "tier")
    source = ("engine", "model_name", "source")
    queries = Counter("vllm:kv_offload_tiering_chunk_queries", "", tier, registry=registry)
    hits = Counter("vllm:kv_offload_tiering_chunk_hits", "", tier, registry=registry)
    computed = Counter("vllm:prompt_tokens_by_source", "", source, registry=registry)
    cached = Counter("vllm:prompt_tokens_cached_by_source", "", source, registry=registry)
    for label, n in (("0:primary", 12), ("1:KvtierDiskTier", 6)):
        queries.labels("0", "m", label).inc(n)
        hits.labels("0", "m", label).inc(n // 2)
    computed.labels("0", "m", "local_compute").inc(1000)
    cached.labels("0", "m", "host").inc(768)
    cached.labels("0", "m", "disk").inc(384)
    return generate_latest(registry).decode()


def test_stats_reads_a_servers_metrics(venv: Path) -> None:
    with served_by(exposition()) as url:
        box = kvtier_in(venv, "stats", url, "--json")
        here = CliRunner().invoke(app, ["stats", url, "--json"])
    assert box.returncode == 0, box.stderr
    assert here.exit_code == 0, here.output
    # The same reading as a full environment's (vLLM's metric definitions included).
    assert json.loads(box.stdout) == json.loads(here.stdout)
    assert [t["tier"] for t in json.loads(box.stdout)["tiers"]] == ["host pool", "disk"]


@pytest.mark.parametrize(
    ("argv", "extra"),
    [(["serve", "./model"], "engine"), (["bench", "shared"], "shared"), (["demo"], "bench")],
)
def test_a_command_needing_an_extra_names_it_in_one_line(
    venv: Path, argv: list[str], extra: str
) -> None:
    done = kvtier_in(venv, *argv)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    ending = f"(kvtier's [{extra}] extra){ALTERNATIVES.get(extra, '')}"
    assert line.startswith("kvtier: ") and line.endswith(ending)
    assert "pip install " in line
