"""The CPU worker moves the right bytes, reports each job once, and leaves no region behind."""

import os
import uuid

import numpy as np
import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from kvtier.vllm.cpu_worker import CpuOffloadingWorker

NUM_BLOCKS = 16
NUM_CHUNKS = 8


def make_worker(page_sizes, bpc, rank=0, world_size=1, engine_id=None):
    tensors = []
    for page in page_sizes:
        data = torch.randint(-128, 127, (NUM_BLOCKS, page), dtype=torch.int8)
        tensors.append(CanonicalKVCacheTensor(data, page))
    refs = [[CanonicalKVCacheRef(i, p) for i, p in enumerate(page_sizes)]]
    cpu_page = sum(page_sizes) * bpc
    row = -(-cpu_page * world_size // 4096) * 4096
    region = SharedOffloadRegion(
        engine_id=engine_id or f"kvtier-test-{uuid.uuid4().hex}",
        num_chunks=NUM_CHUNKS,
        rank=rank,
        kv_bytes_per_chunk=row,
        cpu_page_size=cpu_page,
    )
    worker = CpuOffloadingWorker(CanonicalKVCaches(tensors, refs), bpc, region)
    return worker, [t.tensor for t in tensors], region


def finish(worker, job_ids):
    worker.wait(set(job_ids))
    results = worker.get_finished()
    assert sorted(r.job_id for r in results) == sorted(job_ids)
    assert all(r.success for r in results)
    return {r.job_id: r for r in results}


@pytest.mark.parametrize("bpc", [1, 2])
@pytest.mark.parametrize("page_sizes", [[8192], [6144, 2048, 4096]])
def test_store_then_load_restores_the_same_bytes_into_other_blocks(bpc, page_sizes):
    worker, engine, region = make_worker(page_sizes, bpc)
    try:
        src_blocks = [3, 7, 1, 12]
        chunks = list(range(-(-len(src_blocks) // bpc)))
        before = [t[src_blocks].clone() for t in engine]
        assert worker.submit_store(
            1, GPULoadStoreSpec(src_blocks, [4], [0]), CPULoadStoreSpec(chunks)
        )
        results = finish(worker, [1])
        assert results[1].transfer_size == 4 * sum(page_sizes)
        assert results[1].transfer_time >= 0
        dst_blocks = [0, 2, 4, 5]
        for t in engine:
            t[dst_blocks] = 0
        assert worker.submit_load(
            2, CPULoadStoreSpec(chunks), GPULoadStoreSpec(dst_blocks, [4], [0])
        )
        finish(worker, [2])
        for t, b in zip(engine, before, strict=True):
            assert torch.equal(t[dst_blocks], b)
    finally:
        worker.shutdown()
    assert not os.path.exists(region.mmap_path)


def test_unaligned_first_block_lands_in_the_middle_of_its_chunk():
    worker, engine, region = make_worker([4096], 4)
    try:
        # blocks 5..7 of a request start one sub-block into chunk 1 (5 % 4 == 1)
        worker.submit_store(1, GPULoadStoreSpec([9, 10, 11], [3], [5]), CPULoadStoreSpec([6]))
        finish(worker, [1])
        host = region.base_tensor.view(NUM_CHUNKS, -1)
        row = host[6]
        assert torch.equal(row[4096:8192], engine[0][9])
        assert torch.equal(row[12288:16384], engine[0][11])
        assert torch.count_nonzero(row[:4096]) == 0, "sub-block 0 must stay untouched"
    finally:
        worker.shutdown()


def test_each_rank_writes_only_its_own_slot():
    engine_id = f"kvtier-test-{uuid.uuid4().hex}"
    w0, e0, r0 = make_worker([4096], 1, rank=0, world_size=2, engine_id=engine_id)
    w1, e1, _r1 = make_worker([4096], 1, rank=1, world_size=2, engine_id=engine_id)
    try:
        w0.submit_store(1, GPULoadStoreSpec([2], [1], [0]), CPULoadStoreSpec([3]))
        w1.submit_store(1, GPULoadStoreSpec([5], [1], [0]), CPULoadStoreSpec([3]))
        finish(w0, [1])
        finish(w1, [1])
        row = r0.base_tensor.view(NUM_CHUNKS, -1)[3]
        assert torch.equal(row[:4096], e0[0][2])
        assert torch.equal(row[4096:8192], e1[0][5])
    finally:
        w1.shutdown()
        w0.shutdown()


def test_jobs_of_one_direction_finish_in_submission_order():
    worker, _engine, _ = make_worker([65536], 1)
    try:
        for job in range(1, 21):
            worker.submit_store(
                job,
                GPULoadStoreSpec([job % NUM_BLOCKS], [1], [0]),
                CPULoadStoreSpec([job % NUM_CHUNKS]),
            )
        worker.wait(set(range(1, 21)))
        order = [r.job_id for r in worker.get_finished()]
        assert order == list(range(1, 21))
        assert worker.get_finished() == [], "a job must be reported once"
    finally:
        worker.shutdown()


def test_shutdown_drains_queued_copies_before_releasing_memory():
    worker, _engine, region = make_worker([1 << 20], 1)
    for job in range(1, 9):
        worker.submit_store(job, GPULoadStoreSpec([job], [1], [0]), CPULoadStoreSpec([job % 8]))
    worker.shutdown()  # must not crash or cut a copy short
    assert not os.path.exists(region.mmap_path)


def test_plan_rejects_a_spec_without_chunk_ids():
    worker, _, _ = make_worker([4096], 1)
    try:
        with pytest.raises(TypeError, match="chunk ids"):
            worker.submit_store(1, GPULoadStoreSpec([1], [1], [0]), object())
    finally:
        worker.shutdown()


def test_rejects_kv_tensors_that_are_not_host_int8():
    tensors = [CanonicalKVCacheTensor(torch.zeros(4, 16, dtype=torch.float32), 64)]
    region = SharedOffloadRegion(f"kvtier-test-{uuid.uuid4().hex}", 2, 0, 4096, 64)
    try:
        with pytest.raises(RuntimeError, match="int8"):
            CpuOffloadingWorker(
                CanonicalKVCaches(tensors, [[CanonicalKVCacheRef(0, 64)]]), 1, region
            )
    finally:
        region.cleanup()
    np.testing.assert_equal(os.path.exists(region.mmap_path), False)
