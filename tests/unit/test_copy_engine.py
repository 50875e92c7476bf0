"""The copy engine's split of large loads over several threads."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvtier.vllm.copy_engine import SPLIT_MIN_BYTES, CopyEngine, run_plan
from kvtier.vllm.host_layout import CopyPlan

PAGE = 1 << 16


def scattered_plan(src: np.ndarray, dst: np.ndarray) -> CopyPlan:
    """Page i of ``src`` to page perm[i] of ``dst`` (no two copies share a destination)."""
    pages = src.nbytes // PAGE
    perm = np.random.default_rng(1).permutation(pages).astype(np.uint64)
    offsets = np.arange(pages, dtype=np.uint64) * np.uint64(PAGE)
    return CopyPlan(
        np.uint64(src.ctypes.data) + offsets,
        np.uint64(dst.ctypes.data) + perm * np.uint64(PAGE),
        np.full(pages, PAGE, dtype=np.uint64),
    )


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_split_plan_moves_every_byte_once(parts: int) -> None:
    src = np.random.default_rng(0).integers(0, 255, 2 * SPLIT_MIN_BYTES, dtype=np.uint8)
    dst = np.zeros_like(src)
    plan = scattered_plan(src, dst)
    with ThreadPoolExecutor(3) as helpers:
        run_plan(plan, helpers, parts)
    perm = (plan.dst - np.uint64(dst.ctypes.data)) // np.uint64(PAGE)
    assert np.array_equal(dst.reshape(-1, PAGE)[perm.astype(np.int64)], src.reshape(-1, PAGE))


def test_a_failing_part_is_reraised_after_every_part_finished() -> None:
    src = np.ones(2 * SPLIT_MIN_BYTES, dtype=np.uint8)
    dst = np.zeros_like(src)
    good = scattered_plan(src, dst)
    # A plan whose last part is malformed (sizes one short): zip(strict=True) raises there.
    bad = CopyPlan(good.src, good.dst, good.sizes[:-1])
    with ThreadPoolExecutor(1) as helpers, pytest.raises(ValueError):
        run_plan(bad, helpers, 2)
    # The first part (on the calling thread) still ran to completion.
    assert dst.reshape(-1, PAGE).sum(axis=1).astype(bool).sum() >= len(good.sizes) // 2


def test_engine_splits_loads_and_reports_them_finished() -> None:
    src = np.random.default_rng(2).integers(0, 255, 2 * SPLIT_MIN_BYTES, dtype=np.uint8)
    dst = np.zeros_like(src)
    engine = CopyEngine(load_parts=2)
    try:
        engine.submit_load(7, scattered_plan(src, dst))
        engine.wait({7})
        [job] = engine.take_finished()
    finally:
        engine.close()
    assert job.job_id == 7 and job.error is None
    assert np.array_equal(np.sort(dst), np.sort(src))
