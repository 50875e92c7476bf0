"""The worker's byte placement in the host pool is upstream's, pinned against its own math.

Reference: vLLM's ``compute_sub_block_ptrs`` (the CUDA worker's pointer computation) applied per
KV group the way ``SingleDirectionOffloadingHandler.transfer_async`` applies it.
"""

import mmap

import numpy as np
import pytest
import torch
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs

from kvtier.dataplane.host_layout import CopyRef, TensorPlacement, plan_copies

PAGE = mmap.PAGESIZE


def round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def make_tensors(page_sizes, blocks_per_chunk, num_blocks=16, num_chunks=12, engine_pad=0):
    """Engine tensors (num_blocks, page) and host views carved from one aligned row buffer."""
    engine = []
    for page in page_sizes:
        backing = torch.zeros(num_blocks * (page + engine_pad), dtype=torch.int8)
        engine.append(torch.as_strided(backing, (num_blocks, page), (page + engine_pad, 1)))
    row_stride = round_up(sum(page_sizes) * blocks_per_chunk, PAGE)
    host_backing = torch.zeros(num_chunks * row_stride, dtype=torch.int8)
    host, offset = [], 0
    for page in page_sizes:
        host.append(
            torch.as_strided(
                host_backing, (num_chunks, page * blocks_per_chunk), (row_stride, 1), offset
            )
        )
        offset += page * blocks_per_chunk
    return engine, host, (host_backing, row_stride)


def upstream_plan(
    engine, host, refs_per_group, bpc, block_ids, group_sizes, block_indices, chunk_ids, to_host
):
    """Upstream's descriptor arrays for the direct layout."""
    src_all, dst_all, size_all = [], [], []
    e_off = c_off = 0
    for refs, n, k in zip(refs_per_group, group_sizes, block_indices, strict=True):
        if n == 0:
            continue
        skip = k % bpc
        n_chunks = -(-(n + skip) // bpc)
        g_blocks = np.asarray(block_ids[e_off : e_off + n])
        g_chunks = np.asarray(chunk_ids[c_off : c_off + n_chunks])
        e_off += n
        c_off += n_chunks
        for t_idx, nbytes in refs:
            e_ptrs = np.empty(n, dtype=np.int64)
            h_ptrs = np.empty(n, dtype=np.int64)
            compute_sub_block_ptrs(g_blocks, 1, e_ptrs, engine[t_idx], skip_count=0)
            compute_sub_block_ptrs(g_chunks, bpc, h_ptrs, host[t_idx], skip_count=skip)
            src_all.append(e_ptrs if to_host else h_ptrs)
            dst_all.append(h_ptrs if to_host else e_ptrs)
            size_all.append(np.full(n, nbytes))
    return (
        np.concatenate(src_all).astype(np.uint64),
        np.concatenate(dst_all).astype(np.uint64),
        np.concatenate(size_all).astype(np.uint64),
    )


def placements(engine, host, page_sizes):
    return [
        TensorPlacement(e.data_ptr(), e.stride(0), h.data_ptr(), h.stride(0), p)
        for e, h, p in zip(engine, host, page_sizes, strict=True)
    ]


# page sizes per KV tensor: fp32 / bf16 / fp8 per-layer pages of small models, page-aligned and
# not (the unaligned ones force row padding), one and several tensors
CASES = [
    pytest.param([65536], id="fp32-aligned-1tensor"),
    pytest.param([32768, 32768, 32768], id="bf16-aligned-3tensors"),
    pytest.param([3 * 128 * 64 * 2 * 2], id="smollm2-bf16"),
    pytest.param([6144, 6144], id="fp16-unaligned"),
    pytest.param([1536, 1536, 1536, 1536], id="fp8-unaligned-4tensors"),
    pytest.param([5000], id="odd-size"),
]


@pytest.mark.parametrize("page_sizes", CASES)
@pytest.mark.parametrize("bpc", [1, 2, 4])
@pytest.mark.parametrize("to_host", [True, False])
@pytest.mark.parametrize("first_index", [0, 1, 3, 5])
def test_plan_matches_upstream_pointer_math(page_sizes, bpc, to_host, first_index):
    engine, host, _ = make_tensors(page_sizes, bpc, engine_pad=64 if len(page_sizes) == 1 else 0)
    rng = np.random.default_rng(first_index * 31 + bpc)
    n = 7
    skip = first_index % bpc
    n_chunks = -(-(n + skip) // bpc)
    block_ids = rng.permutation(16)[:n].astype(np.int32)
    chunk_ids = rng.permutation(12)[:n_chunks].astype(np.int32)
    # one ref per tensor; copy the unpadded part only for the last tensor
    refs = [
        [
            (t, p - (8 if t == len(page_sizes) - 1 and p % 16 == 0 else 0))
            for t, p in enumerate(page_sizes)
        ]
    ]
    expected = upstream_plan(
        engine, host, refs, bpc, block_ids, [n], [first_index], chunk_ids, to_host
    )
    plan = plan_copies(
        placements(engine, host, page_sizes),
        [[CopyRef(t, b) for t, b in refs[0]]],
        bpc,
        block_ids,
        [n],
        [first_index],
        chunk_ids,
        to_host,
    )
    np.testing.assert_array_equal(plan.src, expected[0])
    np.testing.assert_array_equal(plan.dst, expected[1])
    np.testing.assert_array_equal(plan.sizes, expected[2])


@pytest.mark.parametrize("bpc", [1, 2, 4])
def test_plan_matches_upstream_with_several_groups(bpc):
    page_sizes = [8192, 8192, 4096]
    engine, host, _ = make_tensors(page_sizes, bpc)
    group_refs = [[(0, 8192), (1, 8192)], [(2, 4096)], [(0, 8192)]]
    group_sizes = [3, 0, 5]
    block_indices = [2, 0, 1]
    n_chunks = [
        -(-(n + k % bpc) // bpc) if n else 0
        for n, k in zip(group_sizes, block_indices, strict=True)
    ]
    block_ids = np.array([9, 4, 11, 0, 1, 2, 3, 15], dtype=np.int32)
    chunk_ids = np.arange(sum(n_chunks), dtype=np.int32)[::-1].copy()
    expected = upstream_plan(
        engine, host, group_refs, bpc, block_ids, group_sizes, block_indices, chunk_ids, True
    )
    plan = plan_copies(
        placements(engine, host, page_sizes),
        [[CopyRef(t, b) for t, b in refs] for refs in group_refs],
        bpc,
        block_ids,
        group_sizes,
        block_indices,
        chunk_ids,
        True,
    )
    np.testing.assert_array_equal(plan.src, expected[0])
    np.testing.assert_array_equal(plan.dst, expected[1])
    np.testing.assert_array_equal(plan.sizes, expected[2])


def test_every_copy_stays_inside_its_host_row_slot():
    page_sizes = [6144, 6144]
    bpc = 2
    engine, host, (backing, row_stride) = make_tensors(page_sizes, bpc)
    plan = plan_copies(
        placements(engine, host, page_sizes),
        [[CopyRef(0, 6144), CopyRef(1, 6144)]],
        bpc,
        np.arange(6, dtype=np.int32),
        [6],
        [1],
        np.array([3, 0, 7, 5], np.int32),
        True,
    )
    base = backing.data_ptr()
    offsets = plan.dst - np.uint64(base)
    within_row = offsets % np.uint64(row_stride)
    assert np.all(within_row + plan.sizes <= np.uint64(sum(page_sizes) * bpc))
    assert len(set(offsets.tolist())) == len(offsets), "two blocks written to the same bytes"


def test_ids_that_do_not_add_up_are_rejected():
    engine, host, _ = make_tensors([4096], 2)
    with pytest.raises(ValueError, match="transfer ids"):
        plan_copies(
            placements(engine, host, [4096]),
            [[CopyRef(0, 4096)]],
            2,
            np.arange(4, dtype=np.int32),
            [4],
            [0],
            np.arange(1, dtype=np.int32),
            True,
        )
