"""A restarted engine weighs its first disk restore with what the engine before it measured.

Process 1 serves cold prompts (its decision times their prefill) and stores them to the disk
tier, then shuts down, leaving the decision's evidence beside the records. Process 2 is a fresh
engine on the same folder: its start-up line says the evidence came from an earlier process,
and its first request that hits the disk is decided (restore or recompute), not restored
unmeasured as a fresh engine without that evidence would.
"""

import re
import stat
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig
from kvtier.store.disk.layout import DECISION_FILE
from tests.support.engine import unique_engine_id, wait_for_namespace_dir
from tests.support.prompts import random_prompt

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT_LEN = 1000
#: Full 128-token blocks of a prompt: what the disk can restore of it.
RESTORABLE = 896
MAX_TOKENS = 4
#: Cold prompts process 1 serves: each is one measured prefill, and the decision needs two
#: steps' worth of evidence (three measurements) before it weighs anything.
PROMPTS = 4
DECISIONS = "kvtier:restore_decisions{tier=disk,verdict=%s}"
ADOPTED = "kvtier:decision_evidence_files{outcome=loaded,tier=disk}"


def engine_config(model: Path, disk_dir: Path, name: str) -> EngineConfig:
    transfer = kvtier.kv_transfer_config(
        host_pool="64MiB", disk_dir=disk_dir, disk_capacity="256MiB", allow_small_tiers=True
    )
    transfer["engine_id"] = unique_engine_id(name)  # a fresh host pool for each process
    return EngineConfig(model=str(model), kv_transfer_config=transfer, in_process=True)


def test_a_fresh_engine_decides_its_first_disk_restore_with_an_earlier_engines_evidence(
    start_engine, tiny_model, tmp_path
):
    disk_dir = tmp_path / "disk"
    prompts = [random_prompt(900 + i, PROMPT_LEN) for i in range(PROMPTS)]

    first = start_engine(engine_config(tiny_model, disk_dir, "evidence-1"), "decision-memory-1")
    for prompt in prompts:
        result, _ = first.generate_one(prompt, MAX_TOKENS)
        assert result.num_cached_tokens == 0, "every prompt of process 1 is cold"
    assert first.reset_prefix_cache(reset_connector=True)  # waits for the disk's stores
    assert first.close() == 0
    ns_dir = wait_for_namespace_dir(disk_dir, tiny_model)
    evidence = ns_dir / DECISION_FILE
    assert evidence.is_file(), "process 1 left its decision's evidence beside its records"
    assert stat.S_IMODE(evidence.stat().st_mode) == 0o600

    second = start_engine(engine_config(tiny_model, disk_dir, "evidence-2"), "decision-memory-2")
    result, _ = second.generate_one(prompts[0], MAX_TOKENS)
    after = second.metrics()
    verdicts = {v: after.get(DECISIONS % v, 0) for v in ("restore", "recompute", "unmeasured")}
    assert verdicts["unmeasured"] == 0, f"weighed, not restored unmeasured: {verdicts}"
    assert verdicts["restore"] + verdicts["recompute"] == 1, verdicts
    restored = RESTORABLE if verdicts["restore"] else 0
    assert result.num_cached_tokens == restored, "the verdict is what the engine did"
    assert after.get(ADOPTED) == 1
    (line,) = [ln for ln in second.log_path.read_text().splitlines() if "kvtier: tiers:" in ln]
    # The disk's own loads join the adopted evidence when process 1 probed its first record
    # before it closed (the probe runs on the housekeeping thread, within a second of it).
    said = re.search(
        r"; decision: \d+ prefill steps( and disk \d+ loads)? measured by an earlier process \(",
        line,
    )
    assert said, line
