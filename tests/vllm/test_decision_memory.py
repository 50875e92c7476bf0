"""The decision's evidence kept with the disk tier: a fresh process's decider starts measured.

Process 1 and process 2 are two policies here (fake clocks, no engine); the file between them
is real. tests/engine/test_decision_memory_e2e.py runs the same across two engine processes.
"""

import logging
import stat
from pathlib import Path

import pytest
from vllm.v1.kv_offload.base import LookupResult

from kvtier.policy import RestorePrior
from kvtier.runtime.decision_memory import (
    SAVE_EVERY_MEASUREMENTS,
    SAVE_INTERVAL_S,
    UNMEASURED,
    DecisionMemory,
)
from kvtier.runtime.engine_policy import make_policy
from kvtier.runtime.startup_line import StartupLine
from kvtier.store.disk.layout import DECISION_FILE
from kvtier.vllm.engine_context import EngineContext
from kvtier.vllm.release import current
from kvtier.vllm.tier_decider import TierDecider
from tests.vllm.test_tier_decider import ROW, TOKENS, Clock, ask, measure_prefill, request

NS = "0123456789abcdef0123456789abcdef"
DEVICE = "cpu: Test CPU x 2"
#: A disk slower than the engine's prefill: a measured decision refuses it.
SLOW_DISK = RestorePrior(bandwidth_bytes_per_s=1e6, latency_s=0.5)


def fresh_decider(clock: Clock) -> TierDecider:
    policy = make_policy(True, clock)
    policy.add_tier("disk", SLOW_DISK, via="host")
    return TierDecider(policy, "disk", TOKENS, ROW, clock, observes_prefill=True)


def memory_of(
    d: TierDecider, path: Path, clock: Clock, device: str | None = DEVICE
) -> DecisionMemory:
    return DecisionMemory(
        d.policy, path, NS, device, wall_clock=lambda: 1_764_590_000.0, clock=clock
    )


@pytest.fixture(autouse=True)
def kvtier_logs_reach_caplog(monkeypatch):  # type: ignore[no-untyped-def]
    # kvtier's logger stops propagating once a tier has set up logging (kvtier.log).
    monkeypatch.setattr(logging.getLogger("kvtier"), "propagate", True)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    folder = tmp_path / NS
    folder.mkdir(mode=0o700)
    return folder / DECISION_FILE


def first_process(path: Path) -> DecisionMemory:
    """Process 1: times its prefills (0.1 ms a token) and saves at shutdown."""
    clock = Clock()
    d = fresh_decider(clock)
    memory = memory_of(d, path, clock)
    assert memory.load() is None, "no file yet"
    measure_prefill(d, clock, 1e-4)
    assert memory.save()
    return memory


def test_a_fresh_process_weighs_its_first_hit_with_the_evidence_an_earlier_one_saved(path):
    first_process(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    clock = Clock()
    d = fresh_decider(clock)
    memory = memory_of(d, path, clock)
    adopted = memory.load()
    assert adopted is not None and adopted.prefill_steps >= 3
    assert memory.loaded == 1 and memory.ignored == 0
    ctx = request(8)
    assert ask(d, ctx, 8) == [LookupResult.RETRY] * 8, "weighed, not restored unmeasured"
    d.end_step()
    assert ask(d, ctx, 8) == [LookupResult.MISS] * 8, "the slow disk loses to recompute"
    assert d.counts.recompute == 1 and d.counts.unmeasured == 0
    assert memory.startup_text == (
        f"decision: {adopted.prefill_steps} prefill steps measured by an earlier process "
        "(2025-12-01 11:53 UTC, cpu: Test CPU x 2)"
    )


def test_without_a_file_the_first_hit_is_restored_unmeasured(path):
    clock = Clock()
    d = fresh_decider(clock)
    memory = memory_of(d, path, clock)
    assert memory.load() is None
    assert ask(d, request(8), 8) == [LookupResult.HIT] * 8
    assert d.counts.unmeasured == 1
    assert memory.startup_text == UNMEASURED


@pytest.mark.parametrize(
    ("device", "reason"),
    [("cpu: Another CPU x 64", "another device"), (DEVICE, "damaged")],
)
def test_a_foreign_or_damaged_file_is_ignored_with_one_warning_and_counted(
    path, caplog, device, reason
):
    first_process(path)
    if reason == "damaged":
        path.write_bytes(path.read_bytes()[:-7])  # torn
    clock = Clock()
    d = fresh_decider(clock)
    memory = memory_of(d, path, clock, device=device)
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        assert memory.load() is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and reason in warnings[0].getMessage()
    assert memory.ignored == 1 and memory.loaded == 0
    assert memory.startup_text.startswith(UNMEASURED) and reason in memory.startup_text
    assert ask(d, request(8), 8) == [LookupResult.HIT] * 8
    assert d.counts.unmeasured == 1


def test_a_device_that_cannot_be_described_keeps_nothing(path):
    first_process(path)
    before = path.read_bytes()
    clock = Clock()
    d = fresh_decider(clock)
    memory = memory_of(d, path, clock, device=None)
    assert memory.load() is None
    assert "cannot be described" in memory.startup_text
    measure_prefill(d, clock, 1e-3)
    assert memory.save()
    assert path.read_bytes() == before, "another device's file is not overwritten"


def test_evidence_is_saved_after_enough_news_or_time_and_not_when_nothing_is_new(path):
    clock = Clock()
    d = fresh_decider(clock)
    memory = memory_of(d, path, clock)
    memory.load()
    memory.maybe_save()
    assert not path.exists(), "nothing measured, nothing written"
    d.policy.observe_prefill([(0, 2048)], 0.2)
    memory.maybe_save()
    assert not path.exists(), "one measurement waits for more, or for the interval"
    clock.now += SAVE_INTERVAL_S
    memory.maybe_save()
    assert path.exists()
    first = path.read_bytes()
    for _ in range(SAVE_EVERY_MEASUREMENTS):
        d.policy.observe_prefill([(0, 2048)], 0.2)
    memory.maybe_save()
    assert path.read_bytes() != first, "enough new measurements are saved at once"
    mtime = path.stat().st_mtime_ns
    clock.now += 10 * SAVE_INTERVAL_S
    memory.maybe_save()
    assert path.stat().st_mtime_ns == mtime, "nothing new, nothing rewritten"


def test_a_save_that_fails_is_counted_warned_once_and_never_raises(tmp_path, caplog):
    clock = Clock()
    d = fresh_decider(clock)
    memory = memory_of(d, tmp_path / "gone" / DECISION_FILE, clock)
    memory.load()
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        for _ in range(3):
            d.policy.observe_prefill([(0, 2048)], 0.2)
            assert memory.save() is False
    assert memory.write_failed == 3
    assert len([r for r in caplog.records if "cannot save" in r.getMessage()]) == 1


def test_the_start_up_line_ends_with_where_the_evidence_comes_from(caplog):
    context = EngineContext(current(), make_policy(True, Clock()))
    context.startup_line = StartupLine("host pool 1 GiB", 1, UNMEASURED)
    context.report_decision("decision: 12 prefill steps measured by an earlier process (...)")
    with caplog.at_level(logging.INFO, logger="kvtier.vllm.spec"):
        context.report("disk /x: cap 1 GiB")
    (line,) = [r.getMessage() for r in caplog.records if "tiers:" in r.getMessage()]
    assert line == (
        "kvtier: tiers: host pool 1 GiB; disk /x: cap 1 GiB; decision: 12 prefill steps "
        "measured by an earlier process (...)"
    )
    off = StartupLine("host pool 1 GiB; restore decision off", 1)
    off.set_decision("decision: anything")
    assert "decision:" not in off.text, "with the decision off the line says nothing of it"


# -- wired into the disk tier ----------------------------------------------------------------


def engine_spec(model_dir: Path):  # type: ignore[no-untyped-def]
    """What kvtier's spec gives its tiers: the policy, the claims, the start-up line."""
    from tests.support.tiers import KvtierSpecStub, offloading_config

    context = EngineContext(current(), make_policy(True, Clock()))
    context.startup_line = StartupLine("host pool", 1, UNMEASURED)
    return KvtierSpecStub(offloading_config(model_dir, 8192), context)


def open_disk_tier(spec, root: Path):  # type: ignore[no-untyped-def]
    import time

    import numpy as np
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_offload.base import ReqContext

    from kvtier.vllm.disk_tier import KvtierDiskTier

    init_none_hash(sha256)
    pool = np.zeros((8, 8192), dtype=np.int8)
    tier = KvtierDiskTier(
        spec, memoryview(pool), "KvtierDiskTier", root_dir=str(root), capacity_bytes="16MiB"
    )
    deadline = time.monotonic() + 30
    while tier.lookup(b"\x01" * 36, ReqContext(req_id="probe")) is LookupResult.RETRY:
        assert time.monotonic() < deadline, "the store never opened"
        time.sleep(0.01)
    return tier


def test_the_disk_tier_saves_at_shutdown_and_a_fresh_tier_adopts_before_its_first_lookup(
    tmp_path,
):
    from kvtier.vllm import metrics

    root = tmp_path / "disk"
    first_spec = engine_spec(tmp_path / "model")
    first = open_disk_tier(first_spec, root)
    assert first_spec.kvtier.evidence_keeper == "disk"
    for n in (1024, 2048, 4096, 3072):
        first_spec.kvtier.policy.observe_prefill([(0, n)], n * 1e-4)
    first.shutdown()
    (saved,) = root.glob(f"*/{DECISION_FILE}")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600

    spec = engine_spec(tmp_path / "model")
    tier = open_disk_tier(spec, root)
    try:
        assert spec.kvtier.policy.prefill.evidence >= 3
        line = spec.kvtier.startup_line.text  # complete: its one tier reported when it opened
        assert line.startswith("host pool; disk ")
        assert "; decision: 4 prefill steps measured by an earlier process (" in line
        counters = tier.get_stats().data["data"]
        assert counters[metrics.EVIDENCE_FILES] == {("disk", "loaded"): 1}
    finally:
        tier.shutdown()
