"""The GPU side-by-side runner's parts that run anywhere: its trial configurations apply their
change in a fresh interpreter (or refuse to start it), and what it counts per run."""

import importlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "benchmarks" / "gpu"


@pytest.fixture
def runner(monkeypatch, tmp_path):
    monkeypatch.setenv("KVTIER_SXS_WORK", str(tmp_path / "work"))
    monkeypatch.syspath_prepend(str(GPU))
    sys.modules.pop("side_by_side", None)
    module = importlib.import_module("side_by_side")
    yield module
    sys.modules.pop("side_by_side", None)


def in_trial(folder: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter that starts with a trial's ``sitecustomize``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([folder, str(REPO / "src")])}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_unsynced_index_trial_applies_in_a_fresh_interpreter(runner, tmp_path):
    folder = runner.trial_path("kvtier-nosync")
    done = in_trial(
        folder,
        "from kvtier.store.disk.index import Index\n"
        f"index = Index({str(tmp_path / 'i.db')!r}, 's', 'ns', 1.0)\n"
        "print(index._conn.execute('PRAGMA synchronous').fetchone()[0])\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert "trial kvtier-nosync applied" in done.stderr


def test_the_no_checksum_trial_writes_headers_without_one(runner):
    done = in_trial(
        runner.trial_path("kvtier-nochecksum"),
        "import kvtier.store.disk.store as store\n"
        "print(store.make_header(b'd' * 16, b'k' * 16, b'x' * 4096).payload_checksum)\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_the_switch_interval_trial_shortens_it(runner):
    trial = runner.trial_path("kvtier-switch")
    done = in_trial(trial, "import sys; print(sys.getswitchinterval())")
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(0.0005)


def test_a_trial_that_cannot_apply_stops_its_interpreter(runner, monkeypatch):
    monkeypatch.setitem(runner.TRIALS, "kvtier-broken", "import kvtier.no_such_module\n")
    done = in_trial(runner.trial_path("kvtier-broken"), "print('served')")
    assert done.returncode != 0
    assert "served" not in done.stdout
    assert "trial kvtier-broken not applied" in done.stderr


def test_plain_configurations_have_no_trial(runner):
    assert runner.trial_path("kvtier") is None
    assert runner.trial_path("prefix-only") is None


def test_every_kvtier_configuration_builds_its_transfer_config(runner):
    for config in runner.KVTIER_CONFIGS:
        if config == "kvtier-shared":
            continue  # needs the Redis URL of a run
        tier = runner.transfer_config(config)["kv_connector_extra_config"]["secondary_tiers"][0]
        assert tier["io_threads"] == (1 if config == "kvtier-io1" else 4)


def test_a_thread_that_waits_is_counted_waiting(runner, tmp_path):
    waited, release = threading.Event(), threading.Event()

    def wait_then_hold() -> None:
        for _ in range(20):
            release.wait(0.002)  # each timed wait gives the CPU up
        waited.set()
        release.wait()

    before = runner.thread_counters(os.getpid())
    thread = threading.Thread(target=wait_then_hold)
    thread.start()
    try:
        assert waited.wait(10)
        after = runner.thread_counters(os.getpid())
        runner.write_thread_cpu(tmp_path, "demo", before, os.getpid(), 1.0)
    finally:
        release.set()
        thread.join()
    mine = next(v for k, v in after.items() if k.endswith(f"({thread.native_id})"))
    assert len(mine) == len(runner.THREAD_COUNTERS)
    assert mine[1] >= 20
    lines = (tmp_path / "cpu-threads-demo.txt").read_text().splitlines()
    assert lines[0].startswith(f"demo: engine core {os.getpid()}, 1.0 s of driver")
    assert "waits" in lines[1] and lines[-1].endswith("total CPU s")


def test_the_machine_counters_name_cpu_time_by_kind(runner, tmp_path):
    counters = runner.system_counters()
    assert {"cpu user s", "cpu idle s", "cpu steal s"} <= set(counters)
    runner.write_system(tmp_path, "demo", {}, 2.0)
    lines = (tmp_path / "system-demo.txt").read_text().splitlines()
    assert lines[0] == "demo: 2.0 s of driver, whole machine"
    assert any(line.endswith("cpu user s") for line in lines[1:])


def test_cuda_graphs_replace_eager_mode_when_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("KVTIER_SXS_WORK", str(tmp_path))
    monkeypatch.setenv("KVTIER_SXS_MODEL", str(tmp_path / "model"))  # no tokenizer to copy
    monkeypatch.syspath_prepend(str(GPU))
    for graphs, eager in (("1", False), ("", True)):
        monkeypatch.setenv("KVTIER_SXS_GRAPHS", graphs)
        sys.modules.pop("side_by_side", None)
        argv = importlib.import_module("side_by_side").server_argv("prefix-only")
        assert ("--enforce-eager" in argv) is eager
        assert ("--compilation-config" in argv) is not eager
        if not eager:
            config = json.loads(argv[argv.index("--compilation-config") + 1])
            assert config["cudagraph_mode"] == "FULL_DECODE_ONLY"
    sys.modules.pop("side_by_side", None)


def test_the_shape_option_names_the_served_model_and_writes_its_config(monkeypatch, tmp_path):
    monkeypatch.setenv("KVTIER_SXS_SHAPE", "llama-3-70b-20l")
    monkeypatch.setenv("KVTIER_SXS_WORK", str(tmp_path / "work"))
    monkeypatch.syspath_prepend(str(GPU))
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tokenizer / name).write_text("{}")
    monkeypatch.setenv("KVTIER_SXS_TOKENIZER", str(tokenizer))
    sys.modules.pop("side_by_side", None)
    try:
        module = importlib.import_module("side_by_side")
        config = json.loads((module.model_dir() / "config.json").read_text())
    finally:
        sys.modules.pop("side_by_side", None)
    assert module.SERVED_NAME == "llama-3-70b-20l-shape"
    assert (config["num_hidden_layers"], config["hidden_size"]) == (20, 8192)
    assert config["vocab_size"] == 49152
