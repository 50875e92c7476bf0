"""The GPU runner's pieces that run without a GPU: its settings and the replay of the decision
evidence a disk folder keeps (``benchmarks/gpu/kvtier_cuda_e2e.py``)."""

import importlib.util
import time
from pathlib import Path
from types import ModuleType

import pytest

from kvtier.policy import evidence_file
from kvtier.policy.prefill import MeasuredStep
from kvtier.policy.restore import MeasuredLoad
from kvtier.policy.restore_policy import PolicyEvidence

RUNNER = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "kvtier_cuda_e2e.py"
KV_PER_TOKEN = 160 * 1024  # the llama-3-70b-40l shape: 40 layers x 8 KV heads x 128, bf16


def load_runner(monkeypatch: pytest.MonkeyPatch, **env: str) -> ModuleType:
    """The runner as a fresh module: it reads its KVTIER_E2E_* settings at import."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("kvtier_cuda_e2e_under_test", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_list_of_disk_threads_is_read_and_the_last_one_serves_the_later_phases(monkeypatch):
    runner = load_runner(monkeypatch, KVTIER_E2E_DISK_THREADS="4,16")
    assert (runner.DISK_THREADS_LIST, runner.DISK_THREADS) == ([4, 16], 16)
    monkeypatch.delenv("KVTIER_E2E_DISK_THREADS")
    runner = load_runner(monkeypatch)
    assert runner.DISK_THREADS == 0, "unset: kvtier's default"


def test_the_half_depth_70b_shape_keeps_the_per_layer_kv(monkeypatch):
    runner = load_runner(monkeypatch, KVTIER_E2E_SHAPE="llama-3-70b-20l")
    assert runner.SHAPE["num_hidden_layers"] == 20
    assert runner.kv_bytes_per_token() == KV_PER_TOKEN // 2


def save_evidence(folder: Path, disk_bytes_per_s: float) -> None:
    """A folder's evidence: prefill at the H200's 70B-40l pace (chunks of 8192), and three
    disk loads of the prompts' sizes at ``disk_bytes_per_s``."""
    steps = [MeasuredStep(((0, 2048),), 0.21)]
    steps += [MeasuredStep(((m, 8192),), 0.9 + m * 1.5e-5) for m in (0, 0, 8192, 16384, 24576)]
    sizes = [n * KV_PER_TOKEN for n in (2048, 8192, 32768)]
    loads = tuple(MeasuredLoad(b, 0.002 + b / disk_bytes_per_s) for b in sizes)
    record = evidence_file.EvidenceFile(
        "0123abcd", "cuda: NVIDIA H200", time.time(), PolicyEvidence(tuple(steps), {"disk": loads})
    )
    (folder / "0123abcd").mkdir(parents=True)
    evidence_file.save(folder / "0123abcd" / "decision.json", record)


@pytest.mark.parametrize(("disk_bytes_per_s", "verdict"), [(20e9, "restore"), (0.3e9, "recompute")])
def test_the_replay_prints_the_evidence_verdict_next_to_the_measured_times(
    monkeypatch, tmp_path, capsys, disk_bytes_per_s, verdict
):
    runner = load_runner(
        monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_SHAPE="llama-3-70b-40l"
    )
    save_evidence(tmp_path / "disk", disk_bytes_per_s)
    cold = {"2048": 0.217, "8192": 0.955, "32768": 4.603}
    restored = {"2048": 0.177, "8192": 0.607, "32768": 2.615}
    runner.replay_evidence(cold, restored)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["c 2048", "c 8192", "c 32768"]
    for line, n in zip(lines, cold, strict=True):
        assert f"): {verdict}; measured restore {restored[n]:.3f}s, cold {cold[n]:.3f}s" in line
        assert "predicted / measured: restore " in line


def test_no_evidence_no_replay(monkeypatch, tmp_path, capsys):
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path))
    runner.replay_evidence({"2048": 0.05}, {})
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("settle", "waits"), [("1", ["8192", "32768"]), ("0", [])])
def test_phase_c_lets_the_disk_writes_settle_before_each_decided_prompt_after_the_first(
    monkeypatch, tmp_path, settle, waits
):
    """b reads with nothing being written; c prefills a new prompt after each decided one,
    whose KV goes to the same disk. So c waits for those writes before the next decision
    (``KVTIER_E2E_SETTLE=0``: it does not)."""
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_SETTLE=settle)
    oracle = [1, 2, 3]
    names = list(runner.prompts())
    (tmp_path / "a.json").write_text(
        runner.json.dumps({n: {"cold": 1.0, "oracle": oracle} for n in names})
    )
    (tmp_path / "b.json").write_text(runner.json.dumps({n: 0.5 for n in names}))
    events: list[str] = []
    decided = {tuple(ids): n for n, (_, ids) in runner.prompts().items()}

    def run(llm, ids, *params):
        events.append(decided.get(tuple(ids), "cold here"))
        return 0.5, len(ids), oracle

    for name, fake in {
        "evidence_summary": lambda: "1 prefill step",
        "replay_evidence": lambda cold, restored: None,
        "drop_page_cache": lambda: None,
        "engine": lambda: object(),
        "run": run,
        "decisions": lambda: {},
        "verdict_of": lambda before, after: "restore",
        "wait_for_disk": lambda: events.append("settled") or 0,
    }.items():
        monkeypatch.setattr(runner, name, fake)
    monkeypatch.setattr(runner.os, "sync", lambda: None)
    assert runner.phase_c()
    decided_at = [i for i, e in enumerate(events) if e in names]
    assert [events[i] for i in decided_at] == names
    assert [events[i] for i in decided_at if i and events[i - 1] == "settled"] == waits
