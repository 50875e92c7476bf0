"""What an operator sees on a real `kvtier serve`'s /metrics: the counters move as they should.

One SmolLM2-135M server with a host pool and a disk tier serves, in order, a miss, a host-pool
hit, a disk hit (host pool emptied by ``reset_prefix_cache(reset_connector=True)``) and a block
damaged on disk under the running server. Each test reads /metrics with prometheus_client's own
parser before and after its request and checks what grew. ``kvtier stats --json`` must agree,
and every metric the Grafana dashboard queries must exist on the server; where the
distribution's ``prometheus`` is installed, a real Prometheus scrapes the server and evaluates
every dashboard query.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from kvtier.bench.harness.server import ServerEngine, free_port
from kvtier.bench.prompts import random_prompt
from kvtier.cli.main import app
from tests.support.engine import until_offloaded

pytestmark = [pytest.mark.engine, pytest.mark.real_model, pytest.mark.timeout(1200)]

PROMPT_LEN = 1000  # 7 full 128-token blocks and a tail
BLOCKS = PROMPT_LEN // 128
RESTORED = BLOCKS * 128
MAX_TOKENS = 8
VOCAB = 49152  # SmolLM2's
HOST, DISK = "0:primary", "1:KvtierDiskTier"
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "dashboard" / "kvtier-grafana.json"

Key = tuple[str, frozenset[tuple[str, str]]]


def scrape(base_url: str) -> dict[Key, float]:
    """Samples of the server's /metrics by (name, labels without engine/model_name)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    samples: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset(
                (k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")
            )
            key = (s.name, labels)
            samples[key] = samples.get(key, 0.0) + s.value
    return samples


def families(base_url: str) -> set[str]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {m for m in re.findall(r"^# TYPE (\S+)", text, re.M)}


def k(name: str, **labels: str) -> Key:
    return (name, frozenset(labels.items()))


QUERIES = "vllm:kv_offload_tiering_chunk_queries_total"
HITS = "vllm:kv_offload_tiering_chunk_hits_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
CACHED = "vllm:prompt_tokens_cached_by_source_total"
LOADED = "kvtier:tier_records_loaded_total"
QUARANTINED = "kvtier:tier_records_quarantined_total"
LOAD_FAILURES = "kvtier:tier_load_failures_total"


class Delta:
    """How much each sample grew between two scrapes (0 for one absent from both)."""

    def __init__(self, before: dict[Key, float], after: dict[Key, float]) -> None:
        self.before, self.after = before, after

    def __call__(self, name: str, **labels: str) -> float:
        key = k(name, **labels)
        return self.after.get(key, 0.0) - self.before.get(key, 0.0)


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kvtier-metrics-disk")


@pytest.fixture(scope="module")
def server(engine_logs: Path, disk_dir: Path) -> Iterator[ServerEngine]:
    from tests.support.models import smollm2

    engine = ServerEngine(
        smollm2(),
        engine_logs / "metrics-server.log",
        host_pool="512MiB",
        disk_dir=disk_dir,
        max_model_len=2048,
        allow_small_tiers=True,  # evictions here are explicit prefix-cache resets
    )
    yield engine
    engine.close()


def settled(server: ServerEngine, before: dict[Key, float], done: Callable[[Delta], bool]) -> Delta:
    """The delta once ``done`` holds: tier counters reach /metrics at the engine's next step,
    so a figure may trail its request by a moment. Gives up after 60 s (the assertions then
    say what was missing)."""
    deadline = time.monotonic() + 60
    while True:
        delta = Delta(before, scrape(server.client.base_url))
        if done(delta) or time.monotonic() > deadline:
            return delta
        time.sleep(0.5)


def request(server: ServerEngine, prompt: list[int]) -> tuple[list[int], int, dict[Key, float]]:
    """Token ids and cached tokens of one request, and the scrape taken just before it."""
    before = scrape(server.client.base_url)
    result, _ = server.generate_one(prompt, MAX_TOKENS)
    return result.token_ids, result.num_cached_tokens, before


def record_files(disk_dir: Path) -> set[Path]:
    return set(disk_dir.rglob("blocks/**/*.kvb"))


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return random_prompt(7100, PROMPT_LEN, VOCAB)


def test_a_miss_computes_every_token_and_hits_no_tier(server, prompt) -> None:
    _, cached, before = request(server, prompt)
    delta = settled(server, before, lambda d: d(BY_SOURCE, source="local_compute") > 0)
    assert cached == 0
    assert delta(BY_SOURCE, source="local_compute") == PROMPT_LEN
    assert delta(BY_SOURCE, source="external_kv_transfer") == 0
    assert delta(QUERIES, tier=HOST) >= 1 and delta(QUERIES, tier=DISK) >= 1
    assert delta(HITS, tier=HOST) == delta(HITS, tier=DISK) == 0


def test_a_host_pool_hit_restores_from_host(server, prompt) -> None:
    assert server.reset_prefix_cache()  # the engine forgets; the host pool keeps the blocks
    _, cached, before = request(server, prompt)
    delta = settled(server, before, lambda d: d(CACHED, source="host") > 0)
    assert cached == RESTORED
    assert delta(CACHED, source="host") == RESTORED
    assert delta(CACHED, source="disk") == 0
    assert delta(BY_SOURCE, source="external_kv_transfer") == RESTORED
    assert delta(HITS, tier=HOST) == BLOCKS
    assert delta(HITS, tier=DISK) == 0 and delta(LOADED, tier="disk") == 0


def test_a_disk_hit_loads_verified_records(server, prompt, disk_dir) -> None:
    until_offloaded(server, lambda: len(record_files(disk_dir)) >= BLOCKS)
    assert server.reset_prefix_cache(reset_connector=True)  # only the disk holds them now
    _, cached, before = request(server, prompt)
    delta = settled(server, before, lambda d: d(LOADED, tier="disk") >= BLOCKS)
    assert cached == RESTORED
    assert delta(CACHED, source="disk") == RESTORED
    assert delta(CACHED, source="host") == 0
    assert delta(HITS, tier=DISK) == BLOCKS
    assert delta(LOADED, tier="disk") == BLOCKS
    assert delta("kvtier:tier_bytes_read_total", tier="disk") > 0
    assert delta("vllm:kv_offload_tiering_read_bytes_total", tier=DISK) > 0
    assert delta(QUARANTINED, tier="disk", reason="checksum") == 0


def test_a_damaged_record_is_quarantined_and_the_output_equals_a_cold_run(server, disk_dir) -> None:
    fresh = random_prompt(7101, PROMPT_LEN, VOCAB)
    known = record_files(disk_dir)
    cold, cached, _ = request(server, fresh)
    assert cached == 0
    until_offloaded(server, lambda: len(record_files(disk_dir) - known) >= BLOCKS)
    assert server.reset_prefix_cache(reset_connector=True)  # waits for its stores
    added = record_files(disk_dir) - known
    assert len(added) == BLOCKS
    for path in added:
        with open(path, "r+b") as f:  # flip one payload byte, past the 4096-byte header
            f.seek(4096 + 1000)
            byte = f.read(1)
            f.seek(4096 + 1000)
            f.write(bytes([byte[0] ^ 0xFF]))
    again, cached, before = request(server, fresh)
    delta = settled(server, before, lambda d: d(QUARANTINED, tier="disk", reason="checksum") > 0)
    assert cached == 0, "no damaged block may be served"
    assert again == cold
    assert delta(QUARANTINED, tier="disk", reason="checksum") >= 1
    assert delta(LOAD_FAILURES, tier="disk") >= 1
    assert delta(CACHED, source="disk") == 0
    assert delta(BY_SOURCE, source="local_compute") == PROMPT_LEN


def test_kvtier_stats_agrees_with_the_server(server) -> None:
    result = CliRunner().invoke(app, ["stats", server.client.base_url, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    samples = scrape(server.client.base_url)
    tiers = {t["tier"]: t for t in data["tiers"]}
    assert set(tiers) == {"host pool", "disk"}
    host, disk = tiers["host pool"], tiers["disk"]
    assert host["chunk_hits"] == samples[k(HITS, tier=HOST)] >= BLOCKS
    assert disk["chunk_queries"] == samples[k(QUERIES, tier=DISK)]
    assert 0 < disk["hit_rate"] < 1
    assert host["tokens_restored"] == samples[k(CACHED, source="host")] >= RESTORED
    assert disk["tokens_restored"] == samples[k(CACHED, source="disk")] >= RESTORED
    assert (
        disk["quarantined"]["checksum"] == samples[k(QUARANTINED, tier="disk", reason="checksum")]
    )
    assert disk["used_bytes"] > 0 and disk["capacity_bytes"] > disk["used_bytes"]
    assert data["prefill_source"] == "kvtier:prefill_seconds_per_token"
    assert data["prefill_saved_s"] == pytest.approx(
        data["tokens_restored"] * data["prefill_s_per_token"]
    )


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_every_metric_the_dashboard_queries_exists_on_the_server(server) -> None:
    declared = families(server.client.base_url)
    used = {m for e in dashboard_queries() for m in re.findall(r"\b(?:vllm|kvtier):\w+", e)}
    # a counter family is declared without _total; queries use the sample name
    missing = {m for m in used if m not in declared and m.removesuffix("_total") not in declared}
    assert not missing


@pytest.fixture
def prometheus(server, tmp_path: Path) -> Iterator[str]:
    """The distribution's Prometheus on loopback, scraping the server every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (apt-get install prometheus)")
    target = server.client.base_url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: kvtier, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def promql(base: str, expr: str) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # a bad query answers 400 with the reason
        return json.loads(exc.read())


def scraped(base: str, expr: str, ok: Callable[[list], bool]) -> list:
    """The result of ``expr`` once ``ok`` holds (Prometheus needs a few scrapes), at most 60 s."""
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = promql(base, expr)
        except OSError:  # not listening yet
            answer = {"data": {"result": []}}
        result = answer.get("data", {}).get("result", [])
        if ok(result) or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_prometheus_scrapes_the_server_and_evaluates_the_dashboard(server, prometheus) -> None:
    # at least three scrapes in the last minute, so rate() has points to work with
    up = scraped(
        prometheus, "count_over_time(up[1m])", lambda r: bool(r) and float(r[0]["value"][1]) >= 3
    )
    assert up and float(up[0]["value"][1]) >= 3, "Prometheus did not scrape the server"
    ours = scrape(server.client.base_url)
    series = scraped(prometheus, f'{HITS}{{tier="{HOST}"}}', bool)
    assert float(series[0]["value"][1]) == ours[k(HITS, tier=HOST)]
    reasons = {dict(labels)["reason"] for name, labels in ours if name == QUARANTINED}
    if reasons:  # after the damaged-record test
        quarantined = scraped(prometheus, QUARANTINED, bool)
        assert {s["metric"]["reason"] for s in quarantined} == reasons
    answers = [promql(prometheus, concrete(expr)) for expr in dashboard_queries()]
    for expr, answer in zip(dashboard_queries(), answers, strict=True):
        assert answer["status"] == "success", (expr, answer)
    hit_rate = answers[0]["data"]["result"]  # the first panel: hit rate per tier
    assert {s["metric"]["tier"] for s in hit_rate} == {HOST, DISK}


def concrete(expr: str) -> str:
    """A dashboard query with Grafana's variables filled in."""
    return expr.replace("$__rate_interval", "1m").replace("$model_name", ".*")
