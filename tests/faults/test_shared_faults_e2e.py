"""The shared tier under server faults, through a real engine (tiny Llama, in-process engines).

One throw-away standalone server and one engine whose only offloading tier past the host pool
is the shared tier (no disk folder: every restore is a read from the server). Each test
applies one fault to the server and checks, through the engine: every request completes, its
output equals the no-offload oracle resuming from as many cached tokens as the request reports
(``tests.support.engine.Oracle``; 0 cached: a cold prefill), the engine keeps serving, and no
request waits longer than the tier's worst case for one operation (``(retries + 1) x
op_timeout_s``) plus the same batch prefilled cold plus slack. That bound is a liveness check
(a stalled client would take tens of seconds per block), not a performance figure. Each test
leaves the server running and the engine restoring from it again.

Also: an engine refuses to start when its server is down, naming the URL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

import kvtier
from kvtier.bench.harness import EngineConfig, EngineError, ProcessEngine
from tests.support.engine import MAX_TOKENS, PROMPT_LEN, Oracle
from tests.support.prompts import random_prompt
from tests.support.redis_servers import RedisServer, free_port, server_binary, start_standalone

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.timeout(900)]

#: The shared tier's defaults (``SharedTierSettings.op_timeout_s``, ``SharedConfig.retries``).
OP_TIMEOUT_S = 2.0
RETRIES = 1
#: Room for scheduling noise on a loaded 2-core machine; far below a stalled client's wait.
SLACK_S = 10.0
#: How long a test waits for the tier's breaker to probe the server again and restore.
RECOVER_S = 60.0
QUARANTINED = "kvtier:tier_records_quarantined"


def wait_bound_s(cold_s: float) -> float:
    """The longest a request may wait under a fault: one tier operation's worst case
    (``(retries + 1) x op_timeout_s``), the same work prefilled cold, and slack."""
    return (RETRIES + 1) * OP_TIMEOUT_S + cold_s + SLACK_S


@dataclass
class Shared:
    """The module's server, its engine and counters of prompts used (each test gets new ones)."""

    server: RedisServer
    engine: ProcessEngine
    oracle: Oracle
    seed: int = 0
    #: TTFT of each request of the last ``check`` (vLLM's figure), for failure messages.
    ttfts: list[float | None] = field(default_factory=list)
    #: Wall time of the last ``check``'s generate call (oracle checks excluded).
    last_s: float = 0.0

    def prompts(self, n: int) -> list[list[int]]:
        first, self.seed = self.seed, self.seed + n
        return [random_prompt(31_000 + first + i, PROMPT_LEN) for i in range(n)]

    def store(self, prompts: list[list[int]]) -> float:
        """Serve ``prompts`` cold (checked), wait for their stores, empty the host pool; returns
        the cold batch's seconds."""
        results, cold_s = self.engine.generate(prompts, MAX_TOKENS)
        assert all(r.num_cached_tokens == 0 for r in results), "prompts must be new"
        for prompt, result in zip(prompts, results, strict=True):
            self.oracle.check(prompt, result)
        self.engine.generate_one(random_prompt(99_000 + self.seed, 64), 1)  # flushes stores
        assert self.engine.reset_prefix_cache(reset_connector=True)
        return cold_s

    def check(self, prompts: list[list[int]]) -> list[int]:
        """Serve ``prompts`` as one batch, each checked against the oracle (after the batch, so
        ``last_s`` is the engine's time alone); returns the cached tokens per request."""
        results, self.last_s = self.engine.generate(prompts, MAX_TOKENS)
        self.ttfts = [r.ttft_s for r in results]
        for prompt, result in zip(prompts, results, strict=True):
            self.oracle.check(prompt, result)
        return [r.num_cached_tokens for r in results]

    def restores_again(self) -> int:
        """Wait (bounded) until a newly stored prompt is restored from the server; returns the
        tries it took."""
        deadline = time.monotonic() + RECOVER_S
        tries = 0
        while True:
            tries += 1
            (prompt,) = self.prompts(1)
            self.store([prompt])
            (cached,) = self.check([prompt])
            if cached > 0:
                assert self.engine.reset_prefix_cache(reset_connector=True)
                return tries
            assert time.monotonic() < deadline, (
                f"no restore {RECOVER_S} s after the fault; tier metrics: {self.tier_metrics()}"
            )
            time.sleep(1.0)

    def tier_metrics(self) -> dict[str, float]:
        return {k: v for k, v in self.engine.metrics().items() if k.startswith("kvtier:")}

    def quarantined(self) -> float:
        return sum(v for k, v in self.engine.metrics().items() if k.startswith(QUARANTINED))


def shared_engine(model: Path, url: str) -> EngineConfig:
    transfer = kvtier.kv_transfer_config(
        host_pool="128MiB",
        shared=url,
        allow_small_tiers=True,  # evictions here are explicit prefix-cache resets
        # Restore every hit: the tiny model's prefill is so cheap that the measured policy
        # recomputes instead once the machine is quiet, and these tests are about faults.
        restore_decision=False,
    )
    return EngineConfig(model=str(model), kv_transfer_config=transfer, in_process=True)


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory,
    start_engine: Callable[..., ProcessEngine],
    tiny_model: Path,
    plain_engine: ProcessEngine,
) -> Iterator[Shared]:
    if server_binary() is None:
        pytest.skip("no redis-server on PATH (run scripts/redis-server.sh)")
    server = start_standalone(tmp_path_factory.mktemp("shared-faults"))
    engine = start_engine(shared_engine(tiny_model, server.url), "shared-faults")
    yield Shared(server, engine, Oracle(plain_engine, MAX_TOKENS))
    engine.close()
    server.kill()


def timed_batch(
    shared: Shared, prompts: list[list[int]], fault: Callable[[], None], delay_s: float
) -> tuple[list[int], float]:
    """Send ``prompts`` as one batch, apply ``fault`` ``delay_s`` later (batch in flight);
    returns the cached tokens per request (each checked against the oracle) and the wall time
    of the batch."""
    box: dict[str, object] = {}

    def serve() -> None:
        try:
            box["cached"] = shared.check(prompts)
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc
        box["seconds"] = shared.last_s

    thread = threading.Thread(target=serve)
    thread.start()
    time.sleep(delay_s)
    fault()
    thread.join(300)
    assert not thread.is_alive(), "the batch never completed"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["cached"], box["seconds"]  # type: ignore[return-value]


def values(server: RedisServer) -> dict[bytes, bytes]:
    """Every kvtier value on the server, read with the plain client."""
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        return {k: client.get(k) for k in client.scan_iter(match=b"kvt:*")}  # type: ignore[misc]
    finally:
        client.close()


# -- start-up ---------------------------------------------------------------------------------


def test_engine_refuses_to_start_when_the_server_is_down_and_names_the_url(
    start_engine: Callable[..., ProcessEngine], tiny_model: Path, reliability
) -> None:
    url = f"redis://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(EngineError) as refused:
        start_engine(shared_engine(tiny_model, url), "shared-faults-down")
    assert url.removeprefix("redis://") in str(refused.value), "the error names the server"
    reliability.record(
        "shared tier: server down (connection refused) at engine start-up",
        "engine",
        1,
        "the engine refuses to start; the error names the URL",
    )


# -- while serving ----------------------------------------------------------------------------


def test_server_killed_mid_batch_requests_complete_with_the_oracle_output(
    shared: Shared, reliability
) -> None:
    stored, others = shared.prompts(4), shared.prompts(4)
    # the cold time of a batch of 8: what the faulted batch costs if every restore is recomputed
    cold_s = shared.store(stored + others)
    fresh = shared.prompts(4)  # their stores meet the dead server
    cached, seconds = timed_batch(shared, stored + fresh, shared.server.kill, delay_s=0.05)
    assert seconds <= wait_bound_s(cold_s), (
        f"batch took {seconds:.1f} s (cold {cold_s:.1f} s); TTFTs {shared.ttfts}; "
        f"tier metrics {shared.tier_metrics()}"
    )
    # the engine stays up and keeps serving with the server gone: every restore a miss
    assert shared.engine.reset_prefix_cache(reset_connector=True)
    after = shared.check(stored)
    waited = shared.last_s
    assert after == [0] * len(stored), "nothing can be restored from a dead server"
    assert waited <= wait_bound_s(cold_s), f"4 requests after the kill took {waited:.1f} s"
    shared.server.restart()
    tries = shared.restores_again()
    reliability.record(
        "shared tier: server SIGKILLed 50 ms into a batch of 4 restores + 4 new prompts; "
        "then requests with the server down; then the server restarted",
        "engine",
        1,
        f"batch of 8 completed in {seconds:.1f} s (8 cold prefills: {cold_s:.1f} s), cached "
        f"tokens {sorted(cached)}, every output equal to the oracle; with the server down 4 "
        f"restores became cold prefills in {waited:.1f} s; engine stayed up and restored from "
        f"the restarted server after {tries} tries",
    )


def test_server_restarted_empty_misses_then_restores_again(shared: Shared, reliability) -> None:
    stored = shared.prompts(3)
    shared.store(stored)
    shared.server.restart()  # same port, every key gone
    cached = shared.check(stored)
    assert cached == [0] * len(stored), "keys the empty server lost must be misses"
    tries = shared.restores_again()
    reliability.record(
        "shared tier: server restarted empty (same port) under a running engine",
        "engine",
        1,
        f"{len(stored)} prompts stored before the restart were misses (cold output, equal to "
        f"the oracle); restores from the server worked again after {tries} tries, engine not "
        "restarted",
    )


def test_frozen_server_reads_time_out_within_the_bound(shared: Shared, reliability) -> None:
    stored = shared.prompts(3)
    cold_s = shared.store(stored)
    shared.server.pause()  # SIGSTOP: sockets stay open, nothing answers
    try:
        cached = shared.check(stored)
        waited = shared.last_s
    finally:
        shared.server.resume()
    assert waited <= wait_bound_s(cold_s), f"requests on a frozen server took {waited:.1f} s"
    tries = shared.restores_again()
    reliability.record(
        "shared tier: server frozen (SIGSTOP) while 3 stored prompts are requested; then SIGCONT",
        "engine",
        1,
        f"served in {waited:.1f} s (cold {cold_s:.1f} s, bound {wait_bound_s(cold_s):.0f} s), "
        f"cached tokens {cached}, outputs equal to the oracle; restores worked again after "
        f"{tries} tries",
    )


def test_corrupted_value_on_the_server_is_recomputed_and_quarantined(
    shared: Shared, reliability
) -> None:
    before = set(values(shared.server))
    (prompt,) = shared.prompts(1)
    shared.store([prompt])
    mine = {k: v for k, v in values(shared.server).items() if k not in before}
    assert mine, "the prompt's blocks are on the server"
    client = redis.Redis(host="127.0.0.1", port=shared.server.port)
    try:
        for key, value in mine.items():
            damaged = bytearray(value)
            damaged[-100] ^= 0x01  # one bit of the payload: header fine, checksum not
            client.set(key, bytes(damaged))
    finally:
        client.close()
    quarantined = shared.quarantined()
    (cached,) = shared.check([prompt])
    assert cached == 0, "a corrupt block must never be served"
    counted = shared.quarantined() - quarantined
    assert counted >= 1, "the corrupt record is counted in kvtier:tier_records_quarantined"
    # the recomputed blocks were stored again: the server now holds good records, which restore
    damaged_values = {k: v for k, v in values(shared.server).items() if k in mine}
    assert shared.engine.reset_prefix_cache(reset_connector=True)
    (again,) = shared.check([prompt])  # checked against the oracle
    rewritten = sum(1 for k, v in damaged_values.items() if v == mine[k])
    reliability.record(
        f"shared tier: every value of one prompt ({len(mine)} blocks) overwritten on the server "
        "with a one-bit payload flip",
        "engine",
        len(mine),
        f"recomputed (0 cached tokens, output equal to the cold oracle); {counted:.0f} "
        f"counted in {QUARANTINED}; the recomputed blocks were stored again ({rewritten} of "
        f"{len(mine)} values on the server equal the originals), and the next request restored "
        f"{again} tokens of them, equal to the oracle",
    )
