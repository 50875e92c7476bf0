"""The benches' tooling without an engine: statistics, metric keys, prompts, paths, reports."""

from pathlib import Path

import pytest

from kvtier.bench.harness.engine import metric_key
from kvtier.bench.openai_client import parse_metrics
from kvtier.bench.prompts import random_prompt
from kvtier.bench.report import median_range, quantile, summarize
from kvtier.paths import cache_dir
from tests.support.reports import PUBLISHED, publish, report_dir


def exposition() -> str:
    """What a vLLM server's /metrics serves: prometheus_client's own text format."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    registry = CollectorRegistry()
    labels = ["engine", "model_name"]
    cached = Counter(
        "vllm:prompt_tokens_cached_by_source", "cached", [*labels, "source"], registry=registry
    )
    cached.labels("0", "model", "host").inc(640)
    Gauge("vllm:num_requests_running", "running", labels, registry=registry).labels(
        "0", "model"
    ).set(2)
    latency = Histogram(
        "vllm:e2e_request_latency_seconds", "latency", labels, buckets=[1.0], registry=registry
    )
    for seconds in (0.5, 0.5, 0.5, 1.0):
        latency.labels("0", "model").observe(seconds)
    return generate_latest(registry).decode()


def test_summary_has_median_tail_and_count() -> None:
    values = [float(v) for v in range(1, 101)]
    summary = summarize(values)
    assert (summary.count, summary.median, summary.p90, summary.p99) == (100, 50.5, 90.0, 99.0)
    assert (summary.min, summary.max) == (1.0, 100.0)
    assert summarize([2.0]).as_dict() == dict(count=1, median=2, p90=2, p99=2, min=2, max=2)
    with pytest.raises(ValueError):
        quantile([], 0.9)


def test_median_range_shows_the_spread() -> None:
    assert median_range([3.0, 1.0, 2.0]) == "2.000 (1.000–3.000)"
    assert median_range([1.25], digits=1) == "1.2"
    assert median_range([]) == "–"


def test_server_metrics_are_keyed_like_the_engine_drivers() -> None:
    samples = parse_metrics(exposition())
    host = metric_key("vllm:prompt_tokens_cached_by_source", {"source": "host", "engine": "0"})
    assert host == "vllm:prompt_tokens_cached_by_source{source=host}"
    assert samples[host] == 640.0
    assert samples["vllm:num_requests_running{}"] == 2.0
    assert samples["vllm:e2e_request_latency_seconds_bucket{le=+Inf}"] == 4.0
    assert samples["vllm:e2e_request_latency_seconds_bucket{le=1.0}"] == 4.0
    assert samples["vllm:e2e_request_latency_seconds_count{}"] == 4.0
    assert not any("_created" in key or "_total" in key for key in samples)


def test_random_prompt_is_a_function_of_its_arguments() -> None:
    prompt = random_prompt(7, 300)
    assert prompt == random_prompt(7, 300)
    assert prompt != random_prompt(8, 300)
    assert len(prompt) == 300 and all(3 <= t < 2048 for t in prompt)
    assert all(100 <= t < 500 for t in random_prompt(1, 200, vocab=500, low=100))


def test_an_empty_cache_dir_variable_counts_as_unset(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KVTIER_CACHE_DIR", "")
    assert cache_dir() == tmp_path / ".cache" / "kvtier"
    monkeypatch.setenv("KVTIER_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"


def test_reports_go_to_the_report_folder_and_only_publish_copies_them(
    monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVTIER_REPORT_DIR", str(tmp_path / "reports"))
    folder = report_dir()
    assert folder == tmp_path / "reports" and folder.is_dir()
    checkout = tmp_path / "checkout"
    (checkout / "docs").mkdir(parents=True)
    (checkout / "docs" / "model-matrix.md").write_text("old matrix\n")
    (folder / "reliability.md").write_text("new table\n")
    done = dict(publish(folder, checkout))
    assert (checkout / "docs" / "reliability.md").read_text() == "new table\n"
    assert (checkout / "docs" / "model-matrix.md").read_text() == "old matrix\n"
    assert done[checkout / "docs" / "model-matrix.md"] is None
    assert set(done) == {checkout / doc for doc in PUBLISHED.values()}


def test_publishing_over_a_doc_keeps_its_hand_written_part(monkeypatch, tmp_path: Path) -> None:
    from tests.support.reports import KEPT_PART

    monkeypatch.setenv("KVTIER_REPORT_DIR", str(tmp_path / "reports"))
    folder = report_dir()
    checkout = tmp_path / "checkout"
    (checkout / "docs").mkdir(parents=True)
    doc = checkout / "docs" / "reliability.md"
    doc.write_text(f"old table\n\n{KEPT_PART}\n## The soak\nan hour\n")
    (folder / "reliability.md").write_text("new table\n")
    publish(folder, checkout)
    assert doc.read_text() == f"new table\n\n{KEPT_PART}\n## The soak\nan hour\n"


def test_every_engine_driver_implements_the_whole_interface() -> None:
    from kvtier.bench.harness import Engine, EngineBase
    from kvtier.bench.harness.inprocess import InProcessEngine
    from kvtier.bench.harness.process import ProcessEngine
    from kvtier.bench.harness.server import ServerEngine

    operations = ["generate", "reset_prefix_cache", "metrics", "close"]
    for driver in (ProcessEngine, InProcessEngine, ServerEngine):
        assert issubclass(driver, EngineBase)
        missing = [op for op in operations if op not in vars(driver)]
        assert missing == [], f"{driver.__name__} lacks {missing}"
        assert all(callable(getattr(driver, op, None)) for op in [*operations, "generate_one"])
    assert {"generate", "generate_one", "reset_prefix_cache", "metrics", "close"} <= set(
        dir(Engine)
    )
