"""The workload driver's pure parts: texts, plans, arrivals, sizing, percentiles, counters."""

import statistics

import pytest

from kvtier.bench.workload import metrics, plan
from kvtier.bench.workload.results import percentiles
from kvtier.bench.workload.text import tagged, words


def test_text_is_a_function_of_its_seed_and_sized_in_words() -> None:
    assert words("a", 50) == words("a", 50)
    assert words("a", 50) != words("b", 50)
    text = words("a", 50)
    assert len(text.replace(".", " .").split()) == 50  # a word or a full stop: a token each
    assert text.count(".") == 3  # after every twelfth word
    text = tagged("doc 3:", "a", 40)
    assert text.startswith("doc 3: ")
    assert len(text.replace(".", " .").split()) == 40 - 1  # the tag's colon counted as a token


def test_poisson_gaps_have_the_rate_and_follow_the_seed() -> None:
    gaps = plan.arrival_gaps(4001, qps=4.0, seed=1)
    assert gaps[0] == 0.0
    assert gaps == plan.arrival_gaps(4001, qps=4.0, seed=1)
    assert gaps != plan.arrival_gaps(4001, qps=4.0, seed=2)
    assert statistics.mean(gaps[1:]) == pytest.approx(0.25, rel=0.05)
    # Exponential: P(gap > mean) = 1/e; a fixed or uniform spacing would miss this.
    assert sum(g > 0.25 for g in gaps[1:]) / 4000 == pytest.approx(0.368, abs=0.03)
    assert plan.arrival_gaps(3, qps=0.0, seed=1) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="qps=-1"):
        plan.arrival_gaps(3, qps=-1, seed=1)


def test_a_plan_is_a_function_of_its_shape_and_seed() -> None:
    shape = plan.Shape("chat", users=3, rounds=2, system_tokens=30, question_tokens=10)
    assert plan.build(shape, qps=2.0) == plan.build(shape, qps=2.0)
    other = plan.build(plan.Shape("chat", users=3, rounds=2, system_tokens=30, seed=1))
    assert [p.messages for p in other] != [p.messages for p in plan.build(shape)]


def test_chat_goes_round_by_round_and_every_user_shares_the_system_prompt() -> None:
    shape = plan.Shape("chat", users=3, rounds=3, system_tokens=30, question_tokens=10)
    requests = plan.build(shape, qps=1.0)
    assert [(p.round, p.unit) for p in requests] == [(r, u) for r in range(3) for u in range(3)]
    first = [p for p in requests if p.round == 0]
    assert len({p.messages[0] for p in first}) == 1 and first[0].messages[0][0] == "system"
    assert all(len(p.messages) == 1 and p.messages[0][0] == "user" for p in requests[3:])
    assert {p.conversation for p in requests} == {"user-0", "user-1", "user-2"}
    assert [p.arrival_s for p in requests] == sorted(p.arrival_s for p in requests)


def test_no_reuse_has_the_chats_prompt_lengths_and_no_shared_start() -> None:
    shape = plan.Shape(
        "no-reuse", users=2, rounds=3, system_tokens=40, question_tokens=10, answer_tokens=5
    )
    requests = plan.build(shape)
    assert all(p.conversation is None for p in requests)
    starts = [p.messages[0][1].split()[:3] for p in requests]
    assert len({tuple(s) for s in starts}) == len(requests)
    for p in requests:
        system_tokens = len(p.messages[0][1].replace(".", " .").split())
        assert system_tokens == 40 + p.round * (10 + 5) - 1


def test_documents_in_tile_order_ask_every_document_before_any_again() -> None:
    shape = plan.Shape("documents", documents=3, questions=2, document_tokens=50)
    requests = plan.build(shape)
    assert [(p.unit, p.round) for p in requests] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)
    ]  # fmt: skip
    doc = requests[0].messages[0][1].split("\n\n")[0]
    assert requests[3].messages[0][1].startswith(doc)
    assert requests[3].messages[0][1] != requests[0].messages[0][1]  # another question


def test_documents_in_random_order_count_each_documents_occurrences() -> None:
    shape = plan.Shape("documents", documents=4, questions=3, order="random", seed=5)
    requests = plan.build(shape)
    pairs = [(p.unit, p.round) for p in requests]
    assert sorted(pairs) == [(d, q) for d in range(4) for q in range(3)]
    assert pairs != [(d, q) for q in range(3) for d in range(4)]  # shuffled
    for d in range(4):
        assert [r for u, r in pairs if u == d] == [0, 1, 2]  # round 0 is the first ask


def test_restart_splits_at_the_middle_round_and_restarts_the_clock() -> None:
    shape = plan.Shape("restart", users=2, rounds=4)
    requests = plan.build(shape, qps=5.0)
    assert shape.split_round == 2
    assert [p.segment for p in requests] == [0] * 4 + [1] * 4
    assert requests[4].arrival_s == 0.0 and requests[5].arrival_s > 0.0
    assert plan.Shape("restart", rounds=4, restart_round=1).split_round == 1
    with pytest.raises(ValueError, match="restart_round=4"):
        plan.Shape("restart", rounds=4, restart_round=4)
    with pytest.raises(ValueError, match="rounds=1"):
        plan.Shape("restart", rounds=1)


def test_a_shape_refuses_unknown_names_and_empty_sizes() -> None:
    with pytest.raises(ValueError, match="workload 'chats'"):
        plan.Shape("chats")
    with pytest.raises(ValueError, match="order 'tiled'"):
        plan.Shape("documents", order="tiled")
    with pytest.raises(ValueError, match="users=0"):
        plan.Shape("chat", users=0)
    with pytest.raises(ValueError, match="question_tokens=0"):
        plan.Shape("chat", question_tokens=0)
    with pytest.raises(ValueError, match="system_tokens=-1"):
        plan.Shape("chat", system_tokens=-1)


def test_pool_sizing_gives_the_asked_multiple_of_the_engine_cache() -> None:
    # 4 rounds x (100 + 50) = 600 tokens a user; 2 x 12,000 - 500 shared = 23,500 -> 40 users
    assert plan.users_for_pool(12_000, 2.0, 4, 500, 100, 50) == 40
    assert plan.documents_for_pool(12_000, 1.5, 1900, 100) == 9
    assert plan.users_for_pool(100, 0.1, 4, 500, 100, 50) == 1


def test_percentiles_are_nearest_rank_over_the_values() -> None:
    got = percentiles([float(v) for v in range(1, 101)])
    assert got == {"p50": 50.5, "p90": 90.0, "p99": 99.0, "count": 100}
    assert percentiles([]) is None


def test_counter_growth_counts_a_reset_counter_from_zero() -> None:
    before = {"a": 100.0, "b": 5.0}
    after = {"a": 30.0, "b": 9.0, "c": 2.0}  # a: reset by a restart, then 30 more
    assert metrics.growth(before, after) == {"a": 30.0, "b": 4.0, "c": 2.0}


def test_counters_and_pool_come_from_vllm_families_only() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    registry = CollectorRegistry()
    source = Counter("vllm:prompt_tokens_by_source", "", ["engine", "source"], registry=registry)
    source.labels("0", "local_compute").inc(70)
    source.labels("1", "local_compute").inc(30)
    source.labels("0", "external_kv_transfer").inc(12)
    Counter("vllm:other", "", registry=registry).inc(5)
    info = Gauge("vllm:cache_config_info", "", ["block_size", "num_gpu_blocks"], registry=registry)
    info.labels("16", "100").set(1)
    text = generate_latest(registry).decode()
    assert metrics.counters(text) == {
        "vllm:prompt_tokens_by_source{source=local_compute}": 100.0,
        "vllm:prompt_tokens_by_source{source=external_kv_transfer}": 12.0,
    }
    assert metrics.pool_tokens(text) == 1600
    assert metrics.counters("not { metrics") == {} and metrics.pool_tokens(None) is None


def test_tier_lines_name_each_tier_and_skip_a_server_without_offloading() -> None:
    from kvtier.bench.workload.output import tier_lines

    counters = {
        "vllm:kv_offload_tiering_chunk_queries{tier=0:primary}": 64.0,
        "vllm:kv_offload_tiering_chunk_hits{tier=0:primary}": 24.0,
        "vllm:kv_offload_tiering_chunk_queries{tier=1:KvtierDiskTier}": 40.0,
        "vllm:kv_offload_tiering_chunk_hits{tier=1:KvtierDiskTier}": 16.0,
        "kvtier:tier_bytes_read{tier=disk}": 3 * 2**20,
        "kvtier:restore_decisions{verdict=restore}": 2.0,
        "vllm:prompt_tokens_by_source{source=local_compute}": 100.0,
    }
    run = {"summary": {"sources": {"counters": counters}}}
    assert tier_lines(run) == [
        "host pool 24 of 64 chunk lookups hit",
        "disk 16 of 40 chunk lookups hit",
        "disk read 3.0 MiB",
        "restore decisions: restore 2",
    ]
    plain = {
        "summary": {"sources": {"counters": {k: v for k, v in counters.items() if "source" in k}}}
    }
    assert tier_lines(plain) == []
