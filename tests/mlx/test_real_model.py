"""Real-model end to end on MLX's CPU backend: SmolLM2-135M (mlx-lm, converted from the project's
PyPI GGUF, no model hub) prefills a prompt whose KV vLLM's scheduler stores through kvtier's MLX
worker into the host pool and the disk tier; a fresh process restores the prefix into other
block ids and continues. Restored KV bytes and the next-token logits must equal a no-offload
resume exactly; a damaged record must be a miss whose output is the cold one.

The phases run in child processes (``tests.mlx.real_model_run``), as a restart would.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.mlx.real_model_run import PREFIX_BLOCKS

pytestmark = [pytest.mark.real_model]

REPO = Path(__file__).resolve().parents[2]


def run_phase(phase: str, folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.mlx.real_model_run", phase, str(folder)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # a phase under heavy load; its engines give up first (RUN_TIMEOUT_S)
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlx-real-model")
    run_phase("store", folder)
    run_phase("restore", folder)
    return {
        name: np.load(folder / f"{name}.npz")
        for name in ("store", "reference", "restore", "damaged")
    } | {"folder": folder}


def test_the_cold_run_computed_the_whole_prompt(runs):
    assert int(runs["store"]["first_computed"]) == 0


def test_a_fresh_process_restores_the_prefix_into_other_block_ids(runs):
    assert int(runs["restore"]["first_computed"]) == PREFIX_BLOCKS * 16
    stored = runs["store"]["block_table"][:PREFIX_BLOCKS]
    restored = runs["restore"]["block_table"][:PREFIX_BLOCKS]
    assert not np.array_equal(stored, restored)


def test_restored_kv_bytes_equal_a_no_offload_resume(runs):
    restored, reference = runs["restore"]["prefix_kv"], runs["reference"]["prefix_kv"]
    assert restored.dtype == np.uint8 and restored.size == reference.size > 0
    assert np.array_equal(restored, reference)


def test_next_token_logits_and_tokens_equal_a_no_offload_resume(runs):
    logits, reference = runs["restore"]["logits"], runs["reference"]["logits"]
    assert logits.shape == reference.shape == (49152,)
    assert float(np.abs(logits - reference).max()) == 0.0
    assert runs["restore"]["tokens"].tolist() == runs["reference"]["tokens"].tolist()


def test_a_damaged_record_is_a_miss_and_the_output_is_the_cold_one(runs):
    damaged, cold = runs["damaged"], runs["store"]
    assert int(damaged["first_computed"]) == 0  # recomputed from the first block
    assert float(np.abs(damaged["logits"] - cold["logits"]).max()) == 0.0
    assert damaged["tokens"].tolist() == cold["tokens"].tolist()
    quarantined = list((runs["folder"] / "disk").rglob("quarantine/*"))
    assert any(p.name.startswith(str(cold["first_key"])) for p in quarantined), quarantined


def test_one_changed_element_of_the_restored_kv_moves_the_logits(runs):
    """The mutation check of the comparison above: one key of the prefix changed by 0.01 moves
    the next-token logits, so a restore that got one element wrong would fail it."""
    mutated, reference = runs["restore"]["mutated_logits"], runs["reference"]["logits"]
    assert float(np.abs(mutated - reference).max()) > 0.0
