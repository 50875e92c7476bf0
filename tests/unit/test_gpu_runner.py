"""The GPU runner's pieces that run without a GPU: its settings and the replay of the decision
evidence a disk folder keeps (``benchmarks/gpu/kvtier_cuda_e2e.py``)."""

import importlib.util
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from kvtier.policy import PolicyEvidence, evidence_file
from kvtier.policy.prefill import MeasuredStep
from kvtier.policy.restore import MeasuredLoad

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


def save_evidence(folder: Path, disk_bytes_per_s: float, tier: str = "disk") -> None:
    """A folder's evidence: prefill at the H200's 70B-40l pace (chunks of 8192), and three
    loads of ``tier`` of the prompts' sizes at ``disk_bytes_per_s``."""
    steps = [MeasuredStep(((0, 2048),), 0.21)]
    steps += [MeasuredStep(((m, 8192),), 0.9 + m * 1.5e-5) for m in (0, 0, 8192, 16384, 24576)]
    sizes = [n * KV_PER_TOKEN for n in (2048, 8192, 32768)]
    loads = tuple(MeasuredLoad(b, 0.002 + b / disk_bytes_per_s) for b in sizes)
    record = evidence_file.EvidenceFile(
        "0123abcd", "cuda: NVIDIA H200", time.time(), PolicyEvidence(tuple(steps), {tier: loads})
    )
    (folder / "0123abcd").mkdir(parents=True)
    evidence_file.save(folder / "0123abcd" / "decision.json", record)
    (folder / "0123abcd" / "namespace.json").write_text('{"namespace": "0123abcd"}')


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
    runner.replay_evidence({n: {"cold": t} for n, t in cold.items()}, restored)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["c 2048", "c 8192", "c 32768"]
    for line, n in zip(lines, cold, strict=True):
        assert f"): {verdict}; measured restore {restored[n]:.3f}s, cold {cold[n]:.3f}s" in line
        assert "predicted / measured: restore " in line


def test_the_replay_sets_the_predictions_against_the_times_less_a_prefix_hit(
    monkeypatch, tmp_path, capsys
):
    """Both predictions leave out what a restore and a recompute both pay (the request's own
    round trip): with a's prefix hits the line gives each measured time less that floor."""
    runner = load_runner(
        monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_SHAPE="llama-3-70b-40l"
    )
    save_evidence(tmp_path / "disk", 2e9)
    runner.replay_evidence({"2048": {"cold": 0.055, "hit": 0.051}}, {"2048": 0.183})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("; less a prefix hit (0.051s): restore 0.132s, recompute 0.004s")
    assert "prefix hit" not in lines[1], "no time measured for 8192: nothing to subtract from"


def test_no_evidence_no_replay(monkeypatch, tmp_path, capsys):
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path))
    runner.replay_evidence({"2048": {"cold": 0.05}}, {})
    assert capsys.readouterr().out == ""


def fake_phase_c(monkeypatch, runner, run, events: list[str]) -> None:
    """Phase c without an engine: ``run`` serves the prompts, and each settle is an event."""
    for name, fake in {
        "evidence_summary": lambda folder="disk": "1 prefill step",
        "replay_evidence": lambda measured, restored, **where: None,
        "drop_page_cache": lambda: None,
        "engine": lambda **where: object(),
        "run": run,
        "decisions": lambda: {},
        "verdict_of": lambda before, after: "restore",
        "wait_for_disk": lambda folder="disk", server=False: events.append("settled") or 0,
    }.items():
        monkeypatch.setattr(runner, name, fake)
    monkeypatch.setattr(runner.os, "sync", lambda: None)


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

    fake_phase_c(monkeypatch, runner, run, events)
    assert runner.phase_c()
    decided_at = [i for i, e in enumerate(events) if e in names]
    assert [events[i] for i in decided_at] == names
    assert [events[i] for i in decided_at if i and events[i - 1] == "settled"] == waits


def test_the_settle_waits_for_the_disk_and_the_server_together(monkeypatch):
    """Until three looks in a row find neither grown: a server still writing after the disk
    stopped keeps the wait going, and the disk's bytes are returned."""
    runner = load_runner(monkeypatch)
    disk = iter([1, 2, 2, 2, 2, 2, 2, 2])
    server = iter([5, 5, 5, 6, 6, 6, 6, 6])
    looks: list[int] = []
    monkeypatch.setattr(runner, "disk_bytes", lambda folder: next(disk))
    monkeypatch.setattr(runner, "shared_bytes", lambda: next(server))
    monkeypatch.setattr(runner.time, "sleep", lambda s: looks.append(s))
    assert runner.wait_for_disk(folder="disk", server=True) == 2
    assert len(looks) == 7, "the server grew at the fourth look: three more unchanged after it"
    monkeypatch.setattr(runner, "shared_bytes", lambda: pytest.fail("no server asked"))
    disk = iter([3, 3, 3, 3])
    assert runner.wait_for_disk(folder="disk") == 3


def test_phase_a_stores_a_second_prompt_of_each_length_unless_told_not_to(monkeypatch, tmp_path):
    """The restore beside each decided prompt needs a second stored prompt of its length, with
    its own oracle; the disk must then hold both (``prompts_kv_bytes``)."""
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_LENGTHS="32,64")
    seen: list[tuple[int, ...]] = []

    def run(llm, ids, *params):
        seen.append(tuple(ids))
        return 0.1, 0, [len(ids), ids[0]]

    fakes = {
        "engine": lambda **where: SimpleNamespace(reset_prefix_cache=lambda: None),
        "run": run,
        "wait_for_disk": lambda timeout_s, server: 10**9,
        "kv_bytes_per_token": lambda: 1,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(runner, name, fake)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    runner.phase_a()
    stored = runner.json.loads((tmp_path / "a.json").read_text())
    twins = runner.twins()
    assert set(twins) == set(runner.prompts()) == {"32", "64"}
    for n, (length, ids) in twins.items():
        assert ids != runner.prompts()[n][1] and len(ids) == length
        assert tuple(ids) in seen
        assert stored[n]["twin_oracle"] == [length, ids[0]]
    assert runner.prompts_kv_bytes() == 2 * (32 + 64)

    runner = load_runner(monkeypatch, KVTIER_E2E_LENGTHS="32,64", KVTIER_E2E_RESTORE_BESIDE="0")
    assert runner.twins() == {}
    monkeypatch.setattr(runner, "kv_bytes_per_token", lambda: 1)
    assert runner.prompts_kv_bytes() == 32 + 64


@pytest.mark.parametrize("url", ["", "redis://127.0.0.1:1"])
def test_phase_a_waits_once_for_the_disk_and_the_server_together(monkeypatch, tmp_path, url):
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_LENGTHS="32")
    monkeypatch.setattr(runner, "SHARED_URL", url or None)
    waits: list[bool] = []

    def wait_for_disk(timeout_s, server):
        waits.append(server)
        return 10**9

    fakes = {
        "engine": lambda **where: SimpleNamespace(reset_prefix_cache=lambda: None),
        "run": lambda llm, ids, *params: (0.1, len(ids), [len(ids)]),
        "wait_for_disk": wait_for_disk,
        "kv_bytes_per_token": lambda: 1,
        "shared_bytes": lambda: 2**30,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(runner, name, fake)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    assert runner.phase_a()
    assert waits == [bool(url)]


@pytest.mark.parametrize("twin_equal", [True, False])
def test_c_restores_a_second_prompt_beside_each_decided_one_and_sets_the_decision_against_both(
    monkeypatch, tmp_path, capsys, twin_equal
):
    """After each decided prompt and its cold companion, once their writes settled, c restores
    a's second prompt of that length with the decision opted out: the decision against the
    better of a cold prefill and a restore, all in one process. A second prompt restored
    wrong fails the phase."""
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_LENGTHS="32,64")
    oracle, twin_oracle = [1, 2], [3, 4]
    names = list(runner.prompts())
    (tmp_path / "a.json").write_text(
        runner.json.dumps({n: {"cold": 1.0, "oracle": oracle, "twin_oracle": twin_oracle}
                           for n in names})
    )  # fmt: skip
    (tmp_path / "b.json").write_text(runner.json.dumps({n: 0.5 for n in names}))
    decided = {tuple(ids): n for n, (_, ids) in runner.prompts().items()}
    twins = {tuple(ids): n for n, (_, ids) in runner.twins().items()}
    events: list[str] = []

    def run(llm, ids, *params):
        if tuple(ids) in twins:
            events.append(f"twin {twins[tuple(ids)]} {params}")
            return 0.4, len(ids), twin_oracle if twin_equal else oracle
        events.append(decided.get(tuple(ids), "cold here"))
        return (0.5, len(ids), oracle) if tuple(ids) in decided else (0.8, 0, [9])

    fake_phase_c(monkeypatch, runner, run, events)
    assert runner.phase_c() is twin_equal
    off = f"({runner.OFF!r},)"
    assert events == [
        "cold here",  # the engine's warm-up prompt
        "32", "cold here", "settled", f"twin 32 {off}",
        "settled", "64", "cold here", "settled", f"twin 64 {off}",
    ]  # fmt: skip
    out = capsys.readouterr().out
    assert (
        f"c 32: disk restore here (a second stored prompt, decision off) 0.400s [32 cached] "
        f"equal={twin_equal}; decision on 1.25x the better of the two here; its verdict, "
        f"against the two here: held"
    ) in out
    assert (
        "c medians: decision on / the better of cold here and disk restore here 32: 1.250x" in out
    )
    assert "c verdicts against the two here (bound 1.05x): 2 held, 0 missed gains, 0 losses" in out


@pytest.mark.parametrize(
    ("restored", "cold_here", "restore_here", "judged"),
    [
        (True, 2.28, 1.98, "held"),
        (True, 2.28, 2.39, "held"),  # 4.8 % slower: within the bound
        (True, 2.00, 2.20, "loss: the restore here took 1.10x cold here"),
        (False, 2.28, 2.20, "held"),
        (False, 2.28, 1.98, "missed gain: cold here took 1.15x the restore here"),
        (False, 0.08, 0.16, "held"),
    ],
)
def test_a_verdict_is_judged_against_the_two_paths_beside_it(
    monkeypatch, restored, cold_here, restore_here, judged
):
    """Wrong only where the path it did not take was faster by more than the bound."""
    runner = load_runner(monkeypatch)
    assert runner.judged_here(restored, cold_here, restore_here) == judged


@pytest.mark.parametrize("twin_equal", [True, False])
def test_damaged_records_are_restored_through_for_the_second_prompts_too(
    monkeypatch, tmp_path, capsys, twin_equal
):
    """e flips bytes in records drawn from every stored prompt, a's second ones included, so it
    restores those too, each against its own oracle."""
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_LENGTHS="32")
    (tmp_path / "a.json").write_text(
        runner.json.dumps({"32": {"cold": 1.0, "oracle": [1], "twin_oracle": [2]}})
    )
    for i in range(3):
        record = tmp_path / "disk" / "ns" / f"{i}.kvb"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_bytes(bytes(8192))
    (tmp_path / "disk" / "ns" / "quarantine").mkdir()
    (tmp_path / "disk" / "ns" / "quarantine" / "0.kvb").write_bytes(b"bad")
    second = tuple(runner.twins()["32"][1])

    def run(llm, ids, *params):
        if tuple(ids) == second:
            return 0.3, len(ids), [2] if twin_equal else [1]
        return 0.2, len(ids), [1]

    monkeypatch.setattr(runner, "engine", lambda **where: object())
    monkeypatch.setattr(runner, "run", run)
    assert runner.phase_e() is twin_equal
    out = capsys.readouterr().out
    assert "e 32: restore over damaged records 0.200s [32 cached] equal=True" in out
    assert (
        f"e 32 (second prompt): restore over damaged records 0.300s [32 cached] equal={twin_equal}"
        in out
    )


def test_the_replay_of_f_reads_the_evidence_d_left(monkeypatch, tmp_path, capsys):
    runner = load_runner(
        monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_SHAPE="llama-3-70b-40l"
    )
    save_evidence(tmp_path / "disk-d", 20e9)
    runner.replay_evidence({"2048": {"cold": 0.2}}, {"2048": 0.1}, folder="disk-d", phase="f")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["f 2048", "f 8192", "f 32768"]
    assert "): restore; measured restore 0.100s, cold 0.200s" in lines[0]
    save_evidence(tmp_path / "disk-e", 20e9, tier="shared")
    runner.replay_evidence({"2048": {"cold": 0.2}}, {}, folder="disk-e", phase="f")
    assert "): recompute" in capsys.readouterr().out, "no loads of the disk tier: its prior alone"


def test_seeding_copies_the_evidence_and_no_record(monkeypatch, tmp_path):
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path))
    save_evidence(tmp_path / "disk", 2e9)
    record = tmp_path / "disk" / "0123abcd" / "blocks" / "ab" / "ab01.1.kvb"
    record.parent.mkdir(parents=True)
    record.write_bytes(b"kv")
    assert runner.seed_evidence("disk", "disk-d") == 1
    seeded = tmp_path / "disk-d" / "0123abcd"
    assert sorted(p.name for p in seeded.iterdir()) == ["decision.json", "namespace.json"]
    for name in ("decision.json", "namespace.json"):
        assert (seeded / name).read_bytes() == (tmp_path / "disk" / "0123abcd" / name).read_bytes()
        assert (seeded / name).stat().st_mode & 0o777 == 0o600
    assert seeded.stat().st_mode & 0o777 == 0o700
    assert runner.seed_evidence("nothing-here", "disk-e") == 0


def test_phase_f_weighs_shared_hits_from_a_folder_of_evidence_alone(monkeypatch, tmp_path, capsys):
    """f starts on a new folder holding d's evidence and no record, replays that evidence for
    the disk tier (the shared server is its second half, so the engine weighs shared hits as
    the disk tier's), and sets each decided prompt against the better of a's cold prefill and
    d's shared restore."""
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_SETTLE="0")
    oracle = [4, 5]
    names = list(runner.prompts())
    (tmp_path / "a.json").write_text(
        runner.json.dumps({n: {"cold": 1.0, "hit": 0.1, "oracle": oracle} for n in names})
    )
    (tmp_path / "d.json").write_text(runner.json.dumps({n: 0.8 for n in names}))
    save_evidence(tmp_path / "disk-d", 2e9)
    asked: list[tuple] = []
    for name, fake in {
        "replay_evidence": lambda measured, restored, **where: asked.append(
            ("replay", {"hits": {n: v["hit"] for n, v in measured.items()}, **where})
        ),
        "engine": lambda **where: asked.append(("engine", where)) or object(),
        "run": lambda llm, ids, *params: (0.4, len(ids), oracle),
        "decisions": lambda: {},
        "verdict_of": lambda before, after: "restore",
    }.items():
        monkeypatch.setattr(runner, name, fake)
    assert runner.phase_f()
    hits = dict.fromkeys(names, 0.1)
    assert ("replay", {"folder": "disk-d", "phase": "f", "hits": hits}) in asked
    assert ("engine", {"disk": "disk-f"}) in asked
    assert (tmp_path / "disk-f" / "0123abcd" / "decision.json").exists()
    out = capsys.readouterr().out
    assert "f 2048: decision restore: restored 0.400s" in out
    assert "shared restore 0.800s, 0.50x the better of the two" in out


@pytest.mark.parametrize(("asked", "ran"), [("abcf", "abcdf"), ("ab", "abd"), ("abdf", "abdf")])
def test_with_a_shared_tier_d_runs_before_f(monkeypatch, tmp_path, asked, ran):
    runner = load_runner(
        monkeypatch,
        KVTIER_E2E_WORK=str(tmp_path),
        KVTIER_E2E_PHASES=asked,
        KVTIER_E2E_REDIS_SERVER="redis-server",
    )
    phases: list[str] = []

    class Server:
        def terminate(self) -> None: ...

        def wait(self, timeout: float) -> None: ...

    monkeypatch.setattr(runner, "start_redis", lambda binary: (Server(), "redis://127.0.0.1:1"))
    monkeypatch.setattr(runner, "run_phase", lambda phase, env: phases.append(phase) or (0, ""))
    monkeypatch.setattr(runner.sys, "argv", ["runner"])
    assert runner.main() == 0
    assert "".join(phases) == ran


def test_phases_d_and_f_without_a_shared_tier_are_refused(monkeypatch, tmp_path, capsys):
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_PHASES="abf")
    monkeypatch.delenv("KVTIER_E2E_REDIS_SERVER", raising=False)
    monkeypatch.setattr(runner, "run_phase", lambda phase, env: pytest.fail("ran " + phase))
    monkeypatch.setattr(runner.sys, "argv", ["runner"])
    assert runner.main() == 2
    assert "set KVTIER_E2E_REDIS_SERVER" in capsys.readouterr().out


@pytest.mark.parametrize("phase", ["l", "m"])
def test_the_concurrent_restores_drop_the_page_cache_before_their_engine_starts(
    monkeypatch, tmp_path, capsys, phase
):
    """l and m are fresh processes reading what k stored, as b and c read a's: with
    KVTIER_E2E_DROP=1 they read it from the disk, not from the page cache k's writes filled."""
    runner = load_runner(monkeypatch, KVTIER_E2E_WORK=str(tmp_path), KVTIER_E2E_CONCURRENT_N="2")
    oracle = [[1, 2], [3, 4]]
    (tmp_path / "k.json").write_text(runner.json.dumps({"cold": 2.0, "oracle": oracle}))
    events: list[str] = []
    for name, fake in {
        "drop_page_cache": lambda: events.append("dropped"),
        "engine": lambda **where: events.append("engine") or object(),
        "run": lambda llm, ids, *params: (0.1, 0, [0]),
        "batch": lambda llm, params: (1.5, [4096, 0], oracle),
    }.items():
        monkeypatch.setattr(runner, name, fake)
    assert runner.PHASES[phase]() == (phase == "m")  # l restores every one, or fails
    assert events == ["dropped", "engine"]
    assert "[Rc], equal=True" in capsys.readouterr().out
