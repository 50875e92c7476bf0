"""A really slow and a stalled disk under a real engine (issue 13, CPU side).

Each test runs on two slow disks (the ``rig`` fixture's parameters):

* ``recordio`` (everywhere, no privileges): the engine's disk tier reads through a throttled
  ``RecordIO`` (``tests/support/throttled_tier.py``) that waits as long as a record takes at
  the rate the test sets;
* ``blkio`` (root, loop devices, cgroup v1 blkio; skips elsewhere, with the reason): the tier
  lives on ext4 on a loop device, and a cgroup v1 blkio throttle slows reads from that device
  for the engine's processes only (``tests/support/slow_disk.py``): the kernel's own I/O path.

The engine is the tiny model in one process (``in_process``), so the process moved into the
cgroup is the one whose scheduler and I/O threads read the disk.

* Stalled: after the tier has measured normal loads, reads are throttled to 4 KB/s (a 256 KiB
  block takes a minute): a request whose prefix is only on the disk costs at most the load
  deadline plus one prefill, its output equals a cold prefill, loads are abandoned
  (``kvtier:tier_loads_abandoned``), and the engine keeps serving.
* Slow but working: throttled so a restore takes about a second, every output equals the
  resume oracle for as many cached tokens as vLLM reported (restored, partly restored) or a
  cold prefill (recomputed), never anything else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.bench.harness import ProcessEngine
from kvtier.policy import DeadlineRule
from kvtier.vllm.tier_decider import REQUEST_DECISION_KEY
from tests.support.engine import (
    FULL_BLOCK_TOKENS,
    MAX_TOKENS,
    PROMPT_LEN,
    Oracle,
    kvtier_engine,
    store_on_disk_only,
    unique_engine_id,
    wait_for_namespace_dir,
)
from tests.support.prompts import random_prompt
from tests.support.slow_disk import SlowDisk, slow_disk_or_skip
from tests.support.throttled_tier import ThrottledDisk, throttled_disk

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.timeout(1200)]

ABANDONED = "kvtier:tier_loads_abandoned{tier=disk}"
OPTED_OUT = "kvtier:restore_decisions{tier=disk,verdict=off}"
OPT_OUT = {REQUEST_DECISION_KEY: False}
#: Reads "never return": 4 KB/s, a minute per 256 KiB block.
STALL_BPS = 4096
#: Slow but working: the 1.75 MiB of one prompt's blocks in about two seconds.
SLOW_BPS = 1 << 20
#: Cold prompts served first, so the decision has measured the engine's prefill.
WARM_PROMPTS = 3
SLACK_S = 30.0
#: The reliability table's words for each kind of slow disk.
HOW = {
    "recordio": "the tier's record reader waits per read",
    "blkio": "cgroup v1 blkio throttle on a loop device",
}


@dataclasses.dataclass
class Rig:
    #: How the reads are slowed: a key of ``HOW``.
    kind: str
    engine: ProcessEngine
    disk: SlowDisk | ThrottledDisk
    ns_dir: Path


@contextlib.contextmanager
def _disk(kind: str, folder: Path) -> Iterator[SlowDisk | ThrottledDisk]:
    if kind == "blkio":
        with slow_disk_or_skip(folder) as disk:
            yield disk
    else:
        yield throttled_disk(folder)


@pytest.fixture(params=["recordio", "blkio"])
def rig(request, tmp_path: Path, tiny_model: Path, engine_logs: Path) -> Iterator[Rig]:  # type: ignore[no-untyped-def]
    """A fresh one-process kvtier engine whose disk tier is on a slow disk of the parameter's
    kind (for ``blkio``, the engine is moved into the disk's cgroup).

    Teardown order: throttle lifted (queued reads finish), engine closed, then (``blkio``) the
    disk is unmounted and its cgroup removed (``slow_disk_or_skip``)."""
    with _disk(request.param, tmp_path / "slow") as disk:
        disk_dir = disk.mount / "tier"
        config = dataclasses.replace(
            kvtier_engine(tiny_model, disk_dir, unique_engine_id("slowtier")), in_process=True
        )
        if isinstance(disk, ThrottledDisk):
            config = disk.engine_config(config)
        engine = ProcessEngine(config, engine_logs / f"slowtier-{time.monotonic_ns()}.log")
        try:
            if isinstance(disk, SlowDisk):
                assert disk.add_session(engine.pid), "no engine process to throttle"
            ns_dir = wait_for_namespace_dir(disk_dir, tiny_model)
            yield Rig(request.param, engine, disk, ns_dir)
        finally:
            disk.throttle(None)
            engine.close()


@pytest.fixture(scope="module")
def oracle(plain_engine: ProcessEngine) -> Oracle:
    return Oracle(plain_engine)


def _prompt(seed: int) -> list[int]:
    return random_prompt(13_000 + seed, PROMPT_LEN)


def _learn(rig: Rig, oracle: Oracle) -> float:
    """Serve cold prompts (prefill evidence) and two disk restores at full speed (the tier's
    loads measured); returns the slowest cold request's seconds."""
    cold_s = 0.0
    for i in range(WARM_PROMPTS):
        result, seconds = rig.engine.generate_one(_prompt(i), MAX_TOKENS)
        assert result.num_cached_tokens == 0
        cold_s = max(cold_s, seconds)
    for i in range(WARM_PROMPTS, WARM_PROMPTS + 2):
        p = _prompt(i)
        store_on_disk_only(rig.engine, rig.ns_dir, p)
        restored, _ = rig.engine.generate_one(p, MAX_TOKENS)
        assert restored.num_cached_tokens == FULL_BLOCK_TOKENS, "unthrottled disk not restored"
        oracle.check(p, restored)
    # A request that opts out of the decision reaches the tier as such (counted ``off``).
    p = _prompt(WARM_PROMPTS + 2)
    store_on_disk_only(rig.engine, rig.ns_dir, p)
    before = rig.engine.metrics().get(OPTED_OUT, 0.0)
    restored, _ = rig.engine.generate_one(p, MAX_TOKENS, kv_transfer_params=OPT_OUT)
    assert rig.engine.metrics().get(OPTED_OUT, 0.0) - before == 1, "the opt-out did not arrive"
    assert restored.num_cached_tokens == FULL_BLOCK_TOKENS
    oracle.check(p, restored)
    assert rig.disk.bytes_read() > 0, "the engine's disk reads did not go through the throttle"
    return cold_s


def _abandoned(engine: ProcessEngine, before: float, timeout_s: float = 30.0) -> float:
    """Abandoned loads since ``before``, waiting for the metric (it is reported at the next
    engine step, so each poll serves a one-token request)."""
    deadline = time.monotonic() + timeout_s
    while True:
        moved = engine.metrics().get(ABANDONED, 0.0) - before
        if moved > 0 or time.monotonic() > deadline:
            return moved
        engine.generate_one(random_prompt(int(time.monotonic_ns() % 10**6), 16), 1)


def test_stalled_disk_costs_one_deadline_and_recomputes(
    rig: Rig, oracle: Oracle, reliability
) -> None:  # type: ignore[no-untyped-def]
    cold_s = _learn(rig, oracle)
    stalled = [_prompt(100 + i) for i in range(2)]
    for p in stalled:
        store_on_disk_only(rig.engine, rig.ns_dir, p)
    before = rig.engine.metrics().get(ABANDONED, 0.0)
    rig.disk.throttle(STALL_BPS)
    # Whatever the measured loads say, no load outlives the policy's ceiling.
    bound_s = DeadlineRule().ceiling_s + cold_s + SLACK_S
    worst_s = 0.0
    for p in stalled:
        result, seconds = rig.engine.generate_one(p, MAX_TOKENS)
        worst_s = max(worst_s, seconds)
        assert seconds < bound_s, f"a stalled disk cost {seconds:.1f} s (bound {bound_s:.1f})"
        assert result.num_cached_tokens == 0, "blocks came from a disk that never answers"
        oracle.check(p, result)
    moved = _abandoned(rig.engine, before)
    assert moved > 0, "no load was abandoned at its deadline"
    # The engine keeps serving (still stalled): cold work is untouched.
    fresh = _prompt(200)
    result, _ = rig.engine.generate_one(fresh, MAX_TOKENS)
    oracle.check(fresh, result)
    reliability.record(
        f"stalled disk (reads throttled to 4 KB/s after normal loads were measured; "
        f"{HOW[rig.kind]})",
        "engine",
        len(stalled),
        f"each request under deadline ceiling + prefill + {SLACK_S:.0f} s (bound "
        f"{bound_s:.0f} s; slowest {worst_s:.1f} s, cold prefill {cold_s:.2f} s), output "
        f"equal to a cold prefill, {moved:.0f} block load(s) abandoned, engine kept serving",
    )


def test_slow_disk_outputs_are_restored_or_recomputed(
    rig: Rig, oracle: Oracle, reliability
) -> None:  # type: ignore[no-untyped-def]
    """Every other request opts out of the decision (``kv_transfer_params``): restored
    whatever the policy predicts, within the same deadlines (or a miss while the tier is
    marked slow after an overrun); its output too equals the oracle."""
    _learn(rig, oracle)
    rig.disk.throttle(SLOW_BPS)
    seen: Counter[str] = Counter()
    for i in range(6):
        p = _prompt(300 + i)
        store_on_disk_only(rig.engine, rig.ns_dir, p)
        params = OPT_OUT if i % 2 else None
        result, _ = rig.engine.generate_one(p, MAX_TOKENS, kv_transfer_params=params)
        oracle.check(p, result)  # the resume reference for exactly this many cached tokens
        cached = result.num_cached_tokens
        seen["restored" if cached == FULL_BLOCK_TOKENS else "recomputed" if not cached else
             "partly restored"] += 1  # fmt: skip
    assert sum(seen.values()) == 6
    reliability.record(
        f"slow disk (reads throttled to {SLOW_BPS >> 20} MiB/s after normal loads were measured; "
        f"{HOW[rig.kind]})",
        "engine",
        6,
        "every output equal to the resume oracle for its cached tokens ("
        + ", ".join(f"{k} {v}" for k, v in sorted(seen.items()))
        + ")",
    )
