"""`kvtier stats` over /metrics text built with prometheus_client, served on loopback."""

from __future__ import annotations

import http.server
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from typer.testing import CliRunner

from kvtier.cli.main import app
from kvtier.metrics_view import HISTOGRAM_SOURCE, POLICY_SOURCE, view_of
from kvtier.vllm import metrics as kvtier_metrics

runner = CliRunner()
ENGINE = ("engine", "model_name")
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "dashboard" / "kvtier-grafana.json"


def kvtier(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


class Exposition:
    """A vLLM-like /metrics built with prometheus_client: only the families kvtier reads."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        tier = (*ENGINE, "tier")
        source = (*ENGINE, "source")
        self.queries = Counter("vllm:kv_offload_tiering_chunk_queries", "", tier, registry=reg)
        self.hits = Counter("vllm:kv_offload_tiering_chunk_hits", "", tier, registry=reg)
        self.read_bytes = Counter("vllm:kv_offload_tiering_read_bytes", "", tier, registry=reg)
        self.read_time = Counter("vllm:kv_offload_tiering_read_time", "", tier, registry=reg)
        self.write_bytes = Counter("vllm:kv_offload_tiering_write_bytes", "", tier, registry=reg)
        self.load_bytes = Counter("vllm:kv_offload_load_bytes", "", ENGINE, registry=reg)
        self.load_time = Counter("vllm:kv_offload_load_time", "", ENGINE, registry=reg)
        self.store_bytes = Counter("vllm:kv_offload_store_bytes", "", ENGINE, registry=reg)
        self.by_source = Counter("vllm:prompt_tokens_by_source", "", source, registry=reg)
        self.cached = Counter("vllm:prompt_tokens_cached_by_source", "", source, registry=reg)
        self.prefill_time = Histogram("vllm:request_prefill_time_seconds", "", ENGINE, registry=reg)
        self.computed = Histogram(
            "vllm:request_prefill_kv_computed_tokens", "", ENGINE, registry=reg
        )
        self.kvtier: dict[str, Counter | Gauge] = {}
        for name, meta in kvtier_metrics.metric_definitions().items():
            kind = Gauge if type(meta).__name__.endswith("GaugeMetadata") else Counter
            self.kvtier[name] = kind(name, "", (*ENGINE, *meta.labelnames), registry=reg)

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def tier(self, label: str, queries: int, hits: int, engine: str = "0") -> None:
        self.queries.labels(engine, "m", label).inc(queries)
        self.hits.labels(engine, "m", label).inc(hits)

    def tokens(self, engine: str = "0", **by_source: int) -> None:
        for source, n in by_source.items():
            family = self.by_source if source.startswith(("local_", "external_kv")) else self.cached
            family.labels(engine, "m", source).inc(n)

    def kv(self, name: str, value: float, *labels: str, engine: str = "0") -> None:
        metric = self.kvtier[name].labels(engine, "m", *labels)
        if isinstance(metric, Gauge):
            metric.set(value)
        else:
            metric.inc(value)


@contextmanager
def served_by(text: Callable[[], str]) -> Iterator[str]:
    """A loopback HTTP server answering GET with ``text()``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text().encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def expo() -> Exposition:
    """Two restores from the host pool, one from disk, one cold request, a quarantine."""
    e = Exposition()
    e.tier("0:primary", queries=12, hits=6)
    e.tier("1:KvtierDiskTier", queries=6, hits=3)
    e.tokens(local_compute=1000, local_cache_hit=128, external_kv_transfer=1152)
    e.tokens(host=768, disk=384, device=0)
    e.load_bytes.labels("0", "m").inc(9 * 2**20)
    e.load_time.labels("0", "m").inc(0.001)
    e.store_bytes.labels("0", "m").inc(6 * 2**20)
    e.read_bytes.labels("0", "m", "1:KvtierDiskTier").inc(3 * 2**20)
    e.read_time.labels("0", "m", "1:KvtierDiskTier").inc(0.002)
    e.write_bytes.labels("0", "m", "1:KvtierDiskTier").inc(6 * 2**20)
    e.kv(kvtier_metrics.BYTES_READ, 3 * 2**20, "disk")
    e.kv(kvtier_metrics.BYTES_WRITTEN, 6 * 2**20 + 6 * 4096, "disk")
    e.kv(kvtier_metrics.QUARANTINED, 2, "disk", "checksum")
    e.kv(kvtier_metrics.QUARANTINED, 1, "disk", "header")
    e.kv(kvtier_metrics.LOAD_FAILURES, 3, "disk")
    e.kv(kvtier_metrics.ABANDONED, 1, "disk")
    e.kv(kvtier_metrics.USED_BYTES, 5 * 2**20, "disk")
    e.kv(kvtier_metrics.CAPACITY_BYTES, 2**30, "disk")
    e.kv(kvtier_metrics.PREFILL_PER_TOKEN, 0.002, "disk")
    return e


@pytest.fixture
def url(expo: Exposition) -> Iterator[str]:
    with served_by(expo.text) as base:
        yield base


def stats_json(url: str) -> dict:
    result = kvtier("stats", url, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def tier_of(data: dict, name: str) -> dict:
    (tier,) = [t for t in data["tiers"] if t["tier"] == name]
    return tier


def test_hit_rate_and_restored_tokens_per_tier(url: str) -> None:
    data = stats_json(url)
    assert [t["tier"] for t in data["tiers"]] == ["host pool", "disk"]
    host, disk = tier_of(data, "host pool"), tier_of(data, "disk")
    assert host["vllm_tier"] == "0:primary" and host["hit_rate"] == pytest.approx(0.5)
    assert disk["vllm_tier"] == "1:KvtierDiskTier" and disk["hit_rate"] == pytest.approx(0.5)
    assert (host["tokens_restored"], disk["tokens_restored"]) == (768, 384)
    assert data["prompt_tokens"]["local_compute"] == 1000
    assert data["tokens_restored"] == 1152


def test_prefill_saved_is_restored_tokens_times_the_policy_estimate(url: str) -> None:
    data = stats_json(url)
    assert data["prefill_source"] == POLICY_SOURCE
    assert data["prefill_s_per_token"] == pytest.approx(0.002)
    assert data["prefill_saved_s"] == pytest.approx(1152 * 0.002)
    assert tier_of(data, "disk")["prefill_saved_s"] == pytest.approx(384 * 0.002)


def test_prefill_falls_back_to_vllms_histograms_and_says_so(expo: Exposition) -> None:
    expo.kv(kvtier_metrics.PREFILL_PER_TOKEN, 0.0, "disk")  # not measured yet
    expo.prefill_time.labels("0", "m").observe(3.0)
    expo.computed.labels("0", "m").observe(1000)
    view = view_of(expo.text())
    assert view.prefill_source == HISTOGRAM_SOURCE
    assert view.prefill_s_per_token == pytest.approx(0.003)
    assert view.prefill_saved_s == pytest.approx(1152 * 0.003)


def test_bytes_failures_quarantines_and_usage_of_the_disk_tier(url: str) -> None:
    disk = tier_of(stats_json(url), "disk")
    assert disk["bytes_read"] == 3 * 2**20  # kvtier's verified bytes
    assert disk["bytes_written"] == 6 * 2**20 + 6 * 4096
    assert disk["restore_bytes_per_s"] == pytest.approx(3 * 2**20 / 0.002)
    assert disk["quarantined"] == {"checksum": 2, "header": 1}
    assert (disk["load_failures"], disk["loads_abandoned"]) == (3, 1)
    assert (disk["used_bytes"], disk["capacity_bytes"]) == (5 * 2**20, 2**30)


def test_host_pool_bytes_are_the_connectors_transfers(url: str) -> None:
    host = tier_of(stats_json(url), "host pool")
    assert (host["bytes_read"], host["bytes_written"]) == (9 * 2**20, 6 * 2**20)
    assert host["restore_bytes_per_s"] == pytest.approx(9 * 2**20 / 0.001)


def test_table_shows_each_tier_as_a_column(url: str) -> None:
    result = kvtier("stats", url)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert re.search(r"hit rate.*50\.0 % \(6/12\).*50\.0 % \(3/6\)", out)
    assert re.search(r"quarantined\s.*checksum 2, header 1", out)
    assert re.search(r"failures\s.*load 3, abandoned 1", out)
    assert "5.00 MiB / 1.00 GiB" in out
    assert "prefill time saved ≈ 2.30 s" in out and POLICY_SOURCE in out
    assert result.stderr == ""


def test_engines_of_one_server_are_summed(expo: Exposition) -> None:
    expo.tier("0:primary", queries=8, hits=2, engine="1")
    expo.tokens(engine="1", host=256, external_kv_transfer=256)
    view = view_of(expo.text())
    host = next(t for t in view.tiers if t.tier == "host pool")
    assert (host.chunk_hits, host.chunk_queries) == (8, 20)
    assert host.tokens_restored == 1024 and view.tokens_restored == 1408


def test_shared_tier_behind_the_disk_gets_a_row_of_its_own() -> None:
    expo = Exposition()
    expo.tier("0:primary", queries=4, hits=0)
    expo.tier("1:KvtierDiskTier", queries=4, hits=4)
    expo.kv(kvtier_metrics.BYTES_READ, 2 * 2**20, "shared")
    expo.kv(kvtier_metrics.QUARANTINED, 1, "shared", "namespace")
    expo.kv(kvtier_metrics.CAPACITY_BYTES, 0, "shared")
    view = view_of(expo.text())
    assert [t.tier for t in view.tiers] == ["host pool", "disk", "shared"]
    shared = view.tiers[2]
    assert shared.vllm_tier is None and shared.hit_rate is None
    assert shared.bytes_read == 2 * 2**20 and shared.quarantined == {"namespace": 1}
    assert shared.capacity_bytes is None, "0 means the server's capacity, not a cap of 0"


def test_a_server_without_offloading_warns_on_stderr() -> None:
    registry = CollectorRegistry()
    tokens = Counter("vllm:prompt_tokens_by_source", "", ("source",), registry=registry)
    tokens.labels("local_compute").inc(10)
    with served_by(lambda: generate_latest(registry).decode()) as base:
        result = kvtier("stats", base, "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["tiers"] == []
    assert "no offloading metrics" in result.stderr


def test_a_kvtier_server_before_its_first_lookup_is_not_warned_about() -> None:
    expo = Exposition()  # the tiering families are declared, without samples yet
    with served_by(expo.text) as base:
        result = kvtier("stats", base)
    assert result.exit_code == 0 and result.stderr == ""
    assert "no tier has been asked" in result.stdout


def test_a_server_that_cannot_be_read_exits_3_with_the_reason() -> None:
    with served_by(lambda: "") as base:
        port = base.rsplit(":", 1)[1]
    result = kvtier("stats", f"http://127.0.0.1:{port}")  # the server is gone
    assert result.exit_code == 3
    assert result.stdout == ""
    assert f"cannot read http://127.0.0.1:{port}/metrics" in result.stderr


def test_text_that_is_not_an_exposition_exits_3() -> None:
    with served_by(lambda: "<html><body>hello</body></html>\n") as base:
        result = kvtier("stats", base + "/metrics")
    assert result.exit_code == 3 and "not a Prometheus exposition" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "give the server's URL"),
        (("--plot", "x.png"), "go together"),
        (("--from", "x.jsonl"), "go together"),
        (("http://h", "--plot", "x.png", "--from", "x.jsonl"), "only --plot"),
        (("http://h", "--watch", "0"), "positive"),
        (("http://h", "--watch", "2", "--json"), "--record"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    result = kvtier("stats", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_record_appends_timestamped_samples(url: str, tmp_path: Path) -> None:
    run = tmp_path / "run.jsonl"
    for _ in range(2):
        assert kvtier("stats", url, "--json", "--record", run).exit_code == 0
    lines = [json.loads(line) for line in run.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["t"] <= lines[1]["t"]
    assert lines[0]["url"] == url + "/metrics"
    assert tier_of(lines[1], "disk")["quarantined"] == {"checksum": 2, "header": 1}


def test_watch_refreshes_records_and_stops_on_ctrl_c(
    expo: Exposition, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run.jsonl"
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # each refresh sees one more cold request
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt
        expo.tokens(local_compute=100)

    monkeypatch.setattr("kvtier.cli.stats.time.sleep", sleep)
    result = kvtier("stats", url, "--watch", "2.5", "--record", run)
    assert result.exit_code == 0, result.output
    assert sleeps == [2.5, 2.5, 2.5]
    computed = [
        json.loads(x)["prompt_tokens"]["local_compute"] for x in run.read_text().splitlines()
    ]
    assert computed == [1000, 1100, 1200]
    assert "stopped (Ctrl-C)" in result.stderr
    assert "hit rate" in result.stdout


def test_plot_draws_a_png_from_a_recorded_run(expo: Exposition, url: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "run.jsonl"
    kvtier("stats", url, "--json", "--record", run)
    expo.tier("1:KvtierDiskTier", queries=4, hits=4)
    expo.read_bytes.labels("0", "m", "1:KvtierDiskTier").inc(4 * 2**20)
    expo.read_time.labels("0", "m", "1:KvtierDiskTier").inc(0.004)
    kvtier("stats", url, "--json", "--record", run)
    png = tmp_path / "out" / "dash.png"
    result = kvtier("stats", "--plot", png, "--from", run)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 samples" in result.stdout


def test_plot_without_matplotlib_says_how_to_install_it(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run.jsonl"
    kvtier("stats", url, "--json", "--record", run)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = kvtier("stats", "--plot", tmp_path / "x.png", "--from", run)
    assert result.exit_code == 1
    assert "needs matplotlib" in result.stderr and "pip install" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_recording_that_cannot_be_read_exits_3(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"t": 1.0, "url": "u", **view_of("").to_dict()})
    bad.write_text(f"{good}\nnot json\n")
    result = kvtier("stats", "--plot", tmp_path / "x.png", "--from", bad)
    assert result.exit_code == 3 and "bad.jsonl:2" in result.stderr
    missing = kvtier("stats", "--plot", tmp_path / "x.png", "--from", tmp_path / "none")
    assert missing.exit_code == 3 and "cannot read" in missing.stderr


def test_dashboard_panels_use_only_known_metrics() -> None:
    """Every kvtier:* name the Grafana dashboard queries is one kvtier defines (vLLM's names
    are checked against a live server in tests/engine/test_metrics_server.py)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Hit rate per tier", "Prompt tokens by source", "Restore bandwidth"} <= titles
    assert {"Quarantined blocks and failed loads", "Usage vs cap"} <= titles
    known = set(kvtier_metrics.metric_definitions())
    used = {m for e in exprs for m in re.findall(r"kvtier:[a-z_]+", e)}
    assert used, "the dashboard shows kvtier's own metrics"
    assert {re.sub(r"_total$", "", m) for m in used} <= known


def test_watch_reports_a_failed_read_once_and_keeps_reading(
    expo: Exposition, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {"now": False}
    run = tmp_path / "run.jsonl"
    calls: list[float] = []

    def sleep(seconds: float) -> None:  # good, broken, broken, good again, Ctrl-C
        calls.append(seconds)
        if len(calls) == 5:
            raise KeyboardInterrupt
        broken["now"] = len(calls) in (1, 2)

    monkeypatch.setattr("kvtier.cli.stats.time.sleep", sleep)
    with served_by(lambda: "<html>down</html>\n" if broken["now"] else expo.text()) as base:
        result = kvtier("stats", base, "--watch", "1", "--record", run)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("retrying every 1 s") == 1
    assert "reading again" in result.stderr
    assert len(run.read_text().splitlines()) == 3  # the first read and two after recovery
