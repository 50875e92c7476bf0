"""``MlxOffloadingWorker`` called directly: the right bytes, in the right rows, for every
element type and both layouts; bad ids refused before a byte moves; each job reported once."""

import uuid

import mlx.core as mx
import numpy as np
import pytest
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from kvtier.errors import ConfigError
from kvtier.mlx.layouts import MlxKVLayout, block_bytes, cache_slots
from kvtier.vllm.file_region import FileOffloadRegion
from kvtier.vllm.mlx_worker import MlxOffloadingWorker
from tests.mlx.paged_caches import CacheShape, LayerwiseCache, make_cache

NUM_ROWS = 8


def random_cache(layout: str, dtype=mx.float32, num_blocks: int = 16):
    shape = CacheShape(
        num_layers=3, num_blocks=num_blocks, block_size=4, kv_heads=2, head_dim=8, dtype=dtype
    )
    cache = make_cache(layout, shape)
    holders = [cache.key_caches, cache.value_caches] if layout == "layerwise" else [cache.pages]
    for arrays in holders:
        for i, array in enumerate(arrays):
            if array.dtype == mx.uint8:
                arrays[i] = mx.random.randint(0, 256, array.shape).astype(mx.uint8)
            else:
                arrays[i] = mx.random.normal(array.shape).astype(array.dtype)
    return cache


def open_worker(
    tmp_path, cache, layout: str, blocks_per_chunk: int = 1, staging_bytes: int = 1 << 20
):
    slots = cache_slots(cache, MlxKVLayout(layout))
    page = sum(block_bytes(s.get()) for s in slots) * blocks_per_chunk
    row = -(-page // 4096) * 4096
    region = FileOffloadRegion(tmp_path, f"mlx-test-{uuid.uuid4().hex}", NUM_ROWS, 0, row, page)
    return MlxOffloadingWorker(slots, blocks_per_chunk, region, staging_bytes), region


def block_bytes_of(cache, ids) -> list[np.ndarray]:
    """Every array's bytes of blocks ``ids``, in the cache's own order."""
    return [np.array(mx.view(a[mx.array(ids)], mx.uint8)) for a in cache.arrays()]


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("layout", ["layerwise", "pages"])
def test_store_then_load_restores_the_same_bytes_into_other_blocks(tmp_path, layout, dtype):
    cache = random_cache(layout, dtype)
    worker, _ = open_worker(tmp_path, cache, layout)
    try:
        before = block_bytes_of(cache, [3, 7, 1, 12])
        assert worker.submit_store(
            1, GPULoadStoreSpec([3, 7, 1, 12], [4], [0]), CPULoadStoreSpec([5, 0, 2, 6])
        )
        assert worker.submit_load(
            2, CPULoadStoreSpec([5, 0, 2, 6]), GPULoadStoreSpec([0, 2, 4, 15], [4], [0])
        )
        after = block_bytes_of(cache, [0, 2, 4, 15])
        for b, a in zip(before, after, strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        worker.shutdown()


def test_a_transfer_staged_one_block_at_a_time_moves_the_same_bytes(tmp_path):
    cache = random_cache("layerwise")
    worker, _ = open_worker(tmp_path, cache, "layerwise", staging_bytes=1)
    try:
        before = block_bytes_of(cache, [9, 10, 11])
        worker.submit_store(1, GPULoadStoreSpec([9, 10, 11], [3], [0]), CPULoadStoreSpec([1, 2, 3]))
        worker.submit_load(2, CPULoadStoreSpec([1, 2, 3]), GPULoadStoreSpec([4, 5, 6], [3], [0]))
        for b, a in zip(before, block_bytes_of(cache, [4, 5, 6]), strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        worker.shutdown()


def test_an_unaligned_first_block_lands_in_the_middle_of_its_row(tmp_path):
    cache = random_cache("pages")
    worker, region = open_worker(tmp_path, cache, "pages", blocks_per_chunk=4)
    try:
        # blocks 5..7 of a request start one sub-block into their row (5 % 4 == 1)
        worker.submit_store(1, GPULoadStoreSpec([9, 10, 11], [3], [5]), CPULoadStoreSpec([6]))
        row = np.array(region.create_kv_memoryview(), dtype=np.uint8)[6]  # a copy of the pool
        page = block_bytes(cache.pages[0])
        first_slot = row[: 4 * page]  # the first array's four sub-blocks
        np.testing.assert_array_equal(first_slot[page : 2 * page], block_bytes_of(cache, [9])[0][0])
        np.testing.assert_array_equal(
            first_slot[3 * page : 4 * page], block_bytes_of(cache, [11])[0][0]
        )
        assert not first_slot[:page].any(), "sub-block 0 must stay untouched"
    finally:
        worker.shutdown()


def test_each_job_is_reported_once_and_wait_returns(tmp_path):
    cache = random_cache("layerwise")
    worker, _ = open_worker(tmp_path, cache, "layerwise")
    try:
        for job in range(1, 6):
            worker.submit_store(job, GPULoadStoreSpec([job], [1], [0]), CPULoadStoreSpec([job]))
        worker.wait({1, 2, 3, 4, 5})
        results = worker.get_finished()
        assert [r.job_id for r in results] == [1, 2, 3, 4, 5]
        assert all(r.success and r.transfer_size == worker.block_bytes for r in results)
        assert worker.get_finished() == []
    finally:
        worker.shutdown()


@pytest.mark.parametrize(
    ("engine", "rows", "message"),
    [
        (
            GPULoadStoreSpec([3, 16], [2], [0]),
            [0, 1],
            r"engine block id\(s\) \[16\] outside \[0, 16\)",
        ),
        (GPULoadStoreSpec([3, -1], [2], [0]), [0, 1], r"engine block id\(s\) \[-1\]"),
        (GPULoadStoreSpec([3, 4], [2], [0]), [0, NUM_ROWS], r"host row id\(s\) \[8\] outside"),
        (GPULoadStoreSpec([3, 4], [2], [0]), [0], "need 2 host rows, got 1"),
        (GPULoadStoreSpec([3, 3], [2], [0]), [0, 1], "appears twice"),
        (GPULoadStoreSpec([3, 4], [1, 1], [0, 0]), [0, 1], "one KV group"),
    ],
)
def test_bad_ids_are_refused_before_anything_is_copied(tmp_path, engine, rows, message):
    cache = random_cache("layerwise")
    worker, region = open_worker(tmp_path, cache, "layerwise")
    try:
        before = block_bytes_of(cache, list(range(16)))
        with pytest.raises(ValueError, match=message):
            worker.submit_load(1, CPULoadStoreSpec(rows), engine)
        with pytest.raises(ValueError, match=message):
            worker.submit_store(2, engine, CPULoadStoreSpec(rows))
        for b, a in zip(before, block_bytes_of(cache, list(range(16))), strict=True):
            np.testing.assert_array_equal(a, b)
        assert not np.frombuffer(region.create_kv_memoryview(), dtype=np.uint8).any()
        assert worker.get_finished() == []
    finally:
        worker.shutdown()


def test_a_host_spec_without_row_ids_is_refused(tmp_path):
    worker, _ = open_worker(tmp_path, random_cache("pages"), "pages")
    try:
        with pytest.raises(TypeError, match="row ids"):
            worker.submit_store(1, GPULoadStoreSpec([1], [1], [0]), object())
    finally:
        worker.shutdown()


def test_shutdown_removes_the_pool_file(tmp_path):
    worker, region = open_worker(tmp_path, random_cache("pages"), "pages")
    worker.submit_store(1, GPULoadStoreSpec([1], [1], [0]), CPULoadStoreSpec([0]))
    worker.shutdown()
    assert list(tmp_path.glob("kvtier_pool_*")) == []
    assert region.mmap_obj is None


def test_a_cache_not_in_the_named_layout_is_refused_naming_the_option():
    cache = LayerwiseCache(CacheShape(2, 4, 4, 2, 8))
    with pytest.raises(ConfigError, match=r"no list 'pages'.*kv_layout"):
        cache_slots(cache, MlxKVLayout.PAGES)


def test_arrays_of_different_block_counts_are_refused():
    cache = LayerwiseCache(CacheShape(2, 4, 4, 2, 8))
    cache.value_caches[1] = mx.zeros((5, 4, 2, 8))
    with pytest.raises(ConfigError, match=r"different block counts \[4, 5\]"):
        cache_slots(cache, MlxKVLayout.LAYERWISE)


def test_a_layerwise_array_of_another_type_is_refused():
    cache = LayerwiseCache(CacheShape(1, 4, 4, 2, 8))
    cache.key_caches[0] = mx.zeros((4, 4, 2, 8), dtype=mx.int32)
    with pytest.raises(ConfigError, match=r"key_caches\[0\] is array mlx.core.int32"):
        cache_slots(cache, MlxKVLayout.LAYERWISE)


def test_an_array_list_holding_something_else_is_refused():
    cache = LayerwiseCache(CacheShape(1, 4, 4, 2, 8))
    cache.value_caches[0] = np.zeros((4, 4, 2, 8), dtype=np.float32)
    with pytest.raises(ConfigError, match=r"value_caches\[0\] is ndarray"):
        cache_slots(cache, MlxKVLayout.LAYERWISE)
