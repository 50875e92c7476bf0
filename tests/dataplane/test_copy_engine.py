"""The copy engine's split of large loads over several threads."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvtier.dataplane import copy_engine
from kvtier.dataplane.copy_engine import SPLIT_MIN_BYTES, CopyEngine, run_plan
from kvtier.dataplane.host_layout import CopyPlan
from kvtier.native import page_copier

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


def test_a_malformed_plan_is_refused_before_any_copy() -> None:
    src = np.ones(4 * PAGE, dtype=np.uint8)
    dst = np.zeros_like(src)
    good = scattered_plan(src, dst)
    with pytest.raises(ValueError, match="copy plan of 3 sizes"):
        run_plan(CopyPlan(good.src, good.dst, good.sizes[:-1]))
    assert not dst.any()


def test_a_failing_part_is_reraised_after_every_part_finished(monkeypatch) -> None:
    src = np.ones(2 * SPLIT_MIN_BYTES, dtype=np.uint8)
    dst = np.zeros_like(src)
    plan = scattered_plan(src, dst)
    real_copy = copy_engine.copy_range

    def failing_second_half(arrays, start: int, stop: int) -> None:
        if start > 0:
            raise OSError("injected")
        real_copy(arrays, start, stop)

    monkeypatch.setattr(copy_engine, "copy_range", failing_second_half)
    with ThreadPoolExecutor(1) as helpers, pytest.raises(OSError, match="injected"):
        run_plan(plan, helpers, 2)
    # The first half (on the calling thread) still ran to completion.
    assert int(dst.sum()) == src.nbytes // 2


@pytest.mark.parametrize("native", [True, False], ids=["streaming", "memmove"])
def test_both_copy_paths_copy_odd_sizes_and_alignments_exactly(native: bool, monkeypatch) -> None:
    if native and page_copier() is None:
        pytest.skip("no C compiler or not x86-64: only the memmove path exists here")
    if not native:
        monkeypatch.setattr(copy_engine, "page_copier", lambda: None)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 255, 8 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    # Sizes below, at and above the streaming threshold; unaligned starts on both sides.
    sizes = [1, 15, 63, 64, 4095, 4096, 4097, 65_537, 196_608, 1_000_003]
    plan_src, plan_dst, cursor = [], [], 0
    for i, size in enumerate(sizes):
        plan_src.append(src.ctypes.data + 3 * i + 7)
        plan_dst.append(dst.ctypes.data + cursor + (i % 17))
        cursor += size + 64
    plan = CopyPlan(*(np.array(v, dtype=np.uint64) for v in (plan_src, plan_dst, sizes)))
    run_plan(plan)
    cursor = 0
    for i, size in enumerate(sizes):
        start = cursor + (i % 17)
        assert np.array_equal(dst[start : start + size], src[3 * i + 7 : 3 * i + 7 + size])
        assert not dst[cursor + size + (i % 17) : cursor + size + 64].any(), "wrote past the end"
        cursor += size + 64


def test_engine_splits_loads_and_reports_them_finished() -> None:
    src = np.random.default_rng(2).integers(0, 255, 2 * SPLIT_MIN_BYTES, dtype=np.uint8)
    dst = np.zeros_like(src)
    engine = CopyEngine(load_parts=2)
    plan = scattered_plan(src, dst)
    try:
        engine.submit_load(7, plan)
        engine.wait({7})
        [job] = engine.take_finished()
    finally:
        engine.close()
    assert job.job_id == 7 and job.error is None
    perm = (plan.dst - np.uint64(dst.ctypes.data)) // np.uint64(PAGE)
    assert np.array_equal(dst.reshape(-1, PAGE)[perm.astype(np.int64)], src.reshape(-1, PAGE))
