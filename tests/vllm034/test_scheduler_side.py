"""vLLM 0.34.0's own scheduler side drives kvtier's disk and shared tiers, without a GPU.

vLLM's ``TieringOffloadingManager`` (lookups, promotions batched per step, cascade stores,
back-pressure) over its real CPU primary tier on a ``/dev/shm`` region, with kvtier's tiers
built by vLLM's own tier factory from ``kv_transfer_config``'s entries, goes through store ->
lookup -> load -> a failed load (a damaged record: a miss, within a bounded number of steps)
-> restart (a new manager on the same folder or server finds the records). The GPU's copies
to and from the primary tier are the test's own writes and reads of its rows.

It runs in the second test environment (``scripts/setup-vllm034.sh``: vllm 0.34.0's CUDA
build, torch 2.14.0) with ``tests/vllm034`` as its only argument (``scripts/test.sh``); under
any other vLLM it skips, saying so.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vllm034 import RELEASE, require_vllm_0_34

require_vllm_0_34()

import numpy as np  # noqa: E402
import redis  # noqa: E402
from typer.testing import CliRunner  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import init_none_hash  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext  # noqa: E402
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (  # noqa: E402
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

import kvtier  # noqa: E402
from kvtier.cli.main import app  # noqa: E402
from kvtier.format import HEADER_BYTES  # noqa: E402
from kvtier.store.shared import KEY_PREFIX  # noqa: E402
from kvtier.vllm.disk_tier import KvtierDiskTier  # noqa: E402
from kvtier.vllm.release import current  # noqa: E402
from kvtier.vllm.release.api_0_33 import Api033  # noqa: E402
from kvtier.vllm.shared_tier import KvtierSharedTier  # noqa: E402
from tests.support.redis_servers import server_binary, start_standalone  # noqa: E402
from tests.support.tiers import offloading_config, stock_spec  # noqa: E402

#: Rows of the primary tier (vLLM's host pool) and their size: a page multiple, as vLLM's
#: region requires.
ROWS, ROW_BYTES = 8, 8192
#: Scheduler steps a test waits for a tier, each a few milliseconds apart.
MAX_STEPS = 3000
STEP_END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def key(i: int) -> bytes:
    """An offload key: a block hash and its group index, as vLLM makes them."""
    return i.to_bytes(4, "big") * 8 + (0).to_bytes(4, "big")


def payload(i: int) -> np.ndarray:
    return (np.arange(ROW_BYTES, dtype=np.int64) * 7 + i * 13).astype(np.int8)


class Scheduler:
    """vLLM's tiering manager over its CPU primary tier and kvtier's tiers, as vLLM's
    ``TieringOffloadingSpec.get_manager`` assembles them, driven the way vLLM's connector
    scheduler drives it (each step's manager calls, ``on_schedule_end`` last)."""

    def __init__(self, tmp_path: Path, tier_configs: list[dict[str, Any]]) -> None:
        self.region = SharedOffloadRegion(
            engine_id=f"kvtier-{uuid.uuid4().hex}",
            num_chunks=ROWS,
            rank=None,
            kv_bytes_per_chunk=ROW_BYTES,
            cpu_page_size=ROW_BYTES,
        )
        self.primary = CPUPrimaryTierOffloadingManager(num_chunks=ROWS, mmap_region=self.region)
        self.rows = np.frombuffer(self.primary.get_kv_memoryview(), dtype=np.int8).reshape(
            ROWS, ROW_BYTES
        )
        spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
        view = self.primary.get_kv_memoryview()
        self.tiers = [
            SecondaryTierFactory.create_secondary_tier(config, view, spec)
            for config in tier_configs
        ]
        self.manager = TieringOffloadingManager(self.primary, self.tiers)
        self._requests = 0
        self._fillers = 1000

    def step(self) -> None:
        with self.manager.lock:
            self.manager.on_schedule_end(STEP_END)
        time.sleep(0.002)

    def until(self, done: Callable[[], bool], what: str) -> int:
        """Steps until ``done()``; fails naming ``what`` after ``MAX_STEPS`` (a livelock)."""
        for steps in range(MAX_STEPS):
            if done():
                return steps
            self.step()
        raise AssertionError(f"{what}: not within {MAX_STEPS} scheduler steps")

    def request(self) -> ReqContext:
        self._requests += 1
        ctx = ReqContext(req_id=f"r{self._requests}")
        with self.manager.lock:
            self.manager.on_new_request(ctx)
        return ctx

    def store(self, ids: list[int]) -> None:
        """One request computes and offloads these blocks: the GPU's copy into the rows
        vLLM's host pool assigns, then the cascade to every secondary tier."""
        ctx = self.request()
        keys = [key(i) for i in ids]
        with self.manager.lock:
            output = self.manager.prepare_store(keys, ctx)
        assert output is not None and list(output.keys_to_store) == keys
        for i, row in zip(ids, output.store_spec.chunk_ids, strict=True):
            self.rows[row] = payload(i)
        with self.manager.lock:
            self.manager.complete_store(keys, ctx)
            self.manager.on_request_finished(ctx)
        self.until(lambda: not self.manager.has_pending_work(), "the stores' cascade")

    def lookup(self, ids: list[int]) -> tuple[ReqContext, list[LookupResult]]:
        """The request's lookups, repeated each step until every block is a hit or a miss
        (vLLM's scheduler asks again while a tier answers RETRY or a promotion is pending)."""
        ctx = self.request()
        results: list[LookupResult] = []

        def settled() -> bool:
            results.clear()
            with self.manager.lock:
                results.extend(self.manager.lookup(key(i), ctx) for i in ids)
            return all(r in (LookupResult.HIT, LookupResult.MISS) for r in results)

        self.until(settled, f"lookups of {ids}")
        return ctx, list(results)

    def load(self, ids: list[int], ctx: ReqContext) -> list[np.ndarray]:
        """The GPU's load of hit blocks from the host pool: the rows' bytes."""
        keys = [key(i) for i in ids]
        with self.manager.lock:
            spec = self.manager.prepare_load(keys, ctx)
        loaded = [self.rows[row].copy() for row in spec.chunk_ids]
        with self.manager.lock:
            self.manager.complete_load(keys, ctx)
            self.manager.on_request_finished(ctx)
        return loaded

    def evict_all(self) -> None:
        """Fill the host pool with new blocks so the earlier ones live only in the tiers."""
        self.store(list(range(self._fillers, self._fillers + ROWS)))
        self._fillers += ROWS

    def close(self) -> None:
        self.until(lambda: not self.manager.has_pending_work(), "pending work at shutdown")
        del self.rows  # the region unmaps only once no view of it is left
        self.manager.shutdown()


@pytest.fixture(autouse=True)
def _hashes() -> None:
    init_none_hash(sha256)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Any]:
    if server_binary() is None:
        pytest.skip("no redis-server on PATH (run scripts/redis-server.sh)")
    started = start_standalone(tmp_path / "redis")
    yield started
    started.stop()


def damage_disk(scheduler: Scheduler, i: int) -> None:
    store = scheduler.tiers[0]._wait_store()
    path = store.record_path(key(i))
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 100] ^= 0x01
    path.write_bytes(bytes(data))


def damage_shared(url: str, i: int) -> None:
    client = redis.Redis.from_url(url)
    (name,) = [n for n in client.scan_iter(KEY_PREFIX + b"*") if n.endswith(key(i).hex().encode())]
    value = bytearray(client.get(name))
    value[HEADER_BYTES + 100] ^= 0x01
    client.set(name, bytes(value))
    client.close()


def round_trip(
    tmp_path: Path,
    tier_configs: list[dict[str, Any]],
    tier_class: type,
    damage: Callable[[Scheduler, int], None],
) -> None:
    first = Scheduler(tmp_path, tier_configs)
    try:
        assert [type(tier) for tier in first.tiers] == [tier_class]
        first.store([1, 2, 3])
        first.evict_all()
        ctx, results = first.lookup([1, 2, 3])
        assert results == [LookupResult.HIT] * 3, "promoted from kvtier's tier"
        loaded = first.load([1, 2, 3], ctx)
        for i, row in zip([1, 2, 3], loaded, strict=True):
            assert np.array_equal(row, payload(i)), f"block {i} restored with other bytes"

        first.evict_all()
        damage(first, 2)
        _, results = first.lookup([2])
        assert results == [LookupResult.MISS], "a damaged record is a miss, never served"
        _, results = first.lookup([2])
        assert results == [LookupResult.MISS], "and stays one: no request promotes it again"
    finally:
        first.close()

    restarted = Scheduler(tmp_path, tier_configs)
    try:
        ctx, results = restarted.lookup([1, 3])
        assert results == [LookupResult.HIT] * 2, "a new manager finds the records"
        loaded = restarted.load([1, 3], ctx)
        assert np.array_equal(loaded[0], payload(1)) and np.array_equal(loaded[1], payload(3))
        _, results = restarted.lookup([2, 77])
        assert results == [LookupResult.MISS] * 2
    finally:
        restarted.close()


def test_the_environment_has_vllms_pins_but_the_one_pypi_lacks():
    """torch as vLLM pins it (PyPI's CUDA build, imported without a GPU); ``pip check``
    names only flashinfer-python, whose pinned 0.7.3 is not on PyPI."""
    import torch

    assert torch.__version__.split("+")[0] == "2.14.0"
    checked = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    assert checked.stdout.splitlines() == [
        f"vllm {RELEASE} requires flashinfer-python, which is not installed."
    ], checked.stdout


def test_the_installed_release_is_api_0_33_with_on_schedule_end_last():
    release = current()
    assert isinstance(release, Api033) and release.name == f"vllm=={RELEASE}"
    assert release.schedule_end_last and not release.cpu_build


def test_vllms_manager_stores_loads_fails_and_restarts_on_kvtiers_disk_tier(tmp_path):
    configs = kvtier.kv_transfer_config(disk_dir=tmp_path / "disk", disk_capacity="16MiB")[
        "kv_connector_extra_config"
    ]["secondary_tiers"]
    assert kvtier.kv_transfer_config()["kv_connector_extra_config"]["spec_name"] == (
        "KvtierCudaSpec"
    ), "a CUDA build: vLLM's own host pool"
    round_trip(tmp_path, configs, KvtierDiskTier, damage_disk)


def test_vllms_manager_stores_loads_fails_and_restarts_on_kvtiers_shared_tier(tmp_path, server):
    configs = kvtier.kv_transfer_config(shared=server.url)["kv_connector_extra_config"][
        "secondary_tiers"
    ]
    round_trip(
        tmp_path, configs, KvtierSharedTier, lambda scheduler, i: damage_shared(server.url, i)
    )


def test_kvtier_serve_on_this_cuda_build_runs_vllms_host_pool_without_a_seed(monkeypatch):
    """The platform is read from the installed build (a ``vllm`` distribution: CUDA), and
    0.34.0 hashes blocks alike in every process without ``PYTHONHASHSEED``."""
    dry = CliRunner().invoke(app, ["serve", "m", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    argv = shlex.split(dry.output.strip().splitlines()[-1])
    extra = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert extra["spec_name"] == "KvtierCudaSpec"
    seen: dict[str, str] = {}
    monkeypatch.setattr(os, "execve", lambda path, args, env: seen.update(env))
    served = CliRunner().invoke(app, ["serve", "m"], env={"PYTHONHASHSEED": None})
    assert served.exit_code == 0, served.output
    assert "PYTHONHASHSEED" not in seen and seen
