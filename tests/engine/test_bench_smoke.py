"""Small, fast runs of every benchmark and the needle probe, so none of them can rot (the
pool-on-disk bench starts two engines of its own: ``slow``).

Figures from these runs mean nothing (tiny model, one repetition, engines in one process);
the assertions check that each tool runs end to end and writes its table, data and plot.
"""

import json

import pytest

from benchmarks import bandwidth, decision_abba, encryption_cost
from kvtier.bench import concurrent, overhead, ttft

pytestmark = pytest.mark.engine


def test_ttft_bench_runs_every_kind_and_writes_table_data_and_plot(tiny_model, tmp_path):
    ttft.run(
        str(tiny_model),
        [300],
        1,
        tmp_path,
        host_pool="2GiB",
        progress=lambda _: None,
        in_process=True,
        decisions=(False,),  # the tiny model recomputes about as fast as it restores
    )
    data = json.loads((tmp_path / "ttft.json").read_text())
    for kind in ttft.KINDS:
        (sample,) = data["samples"]["300"][kind]
        expected_cached = 0 if kind == "cold" else 256
        assert sample["cached"] == expected_cached, kind
    assert "cold / host-pool restore" in (tmp_path / "ttft.md").read_text()
    assert (tmp_path / "ttft.png").stat().st_size > 0


def test_concurrent_bench_restores_every_request(tiny_model, tmp_path):
    result = concurrent.run(
        str(tiny_model),
        300,
        [1, 2],
        tmp_path,
        host_pool="2GiB",
        progress=lambda _: None,
        in_process=True,
    )
    assert [r["n"] for r in result["rows"]] == [1, 2]
    assert all(min(r["restored_cached_tokens"]) == 256 for r in result["rows"])
    assert (tmp_path / "concurrent.png").exists()


def test_same_engine_decision_bench_restores_the_opted_out_requests(tiny_model, tmp_path):
    """Opted-out requests are restored whatever the tiny model's decision says (it may rightly
    refuse: one block of it recomputes in about a millisecond), and both settings are timed."""
    result = decision_abba.run_same_engine(
        str(tiny_model), [300], 2, tmp_path, batch=2, progress=lambda _: None, in_process=True
    )
    assert min(result["cached"]["300/single/off"]) == 256
    assert min(result["cached"]["300/batch of 2/off"]) == 256
    assert len(result["samples"]["300/single/on"]) == 2
    assert result["verdicts"].get("off", 0) == 6, result["verdicts"]
    assert "on / off" in (tmp_path / "decision-same-engine.md").read_text()


# Slow (six engines, ~110 s on 2 cores): a lab benchmark, kept out of the default run's
# time budget; the sealed store path it measures is covered by the store and engine tests.
@pytest.mark.slow
def test_encryption_bench_restores_from_disk_in_both_settings_and_cleans_up(tiny_model, tmp_path):
    """Every reader restores every prompt (the bench raises on a partial restore), the
    settings alternate, and the written folders and the bench's key are gone afterwards."""
    result = encryption_cost.run(
        str(tiny_model), [300], 2, tmp_path, rounds=1, progress=lambda _: None, in_process=True
    )
    assert [e["setting"] for e in result["engines"]] == ["off", "on"]
    for engine in result["engines"]:
        assert {k: len(v) for k, v in engine["samples"].items()} == {"300/fresh": 2, "300/warm": 2}
    assert {s: len(c["300"]) for s, c in result["cold"].items()} == {"off": 2, "on": 2}
    table = (tmp_path / "encryption.md").read_text()
    assert "on / off" in table and "seal GB/s, one core" in table
    assert not list(tmp_path.glob("disk-encryption-*"))
    assert not (tmp_path / "bench-master-key").exists()


def test_overhead_bench_compares_on_and_off_with_zero_reuse(tiny_model, tmp_path):
    result = overhead.run(
        str(tiny_model),
        tmp_path,
        requests=2,
        latency_requests=2,
        prompt_len=128,
        output_len=4,
        passes=1,
        progress=lambda _: None,
        in_process=True,
        compare_decision=True,
    )
    assert set(result["passes"]) == {"off", "on", overhead.NO_DECISION}
    assert all(p["ttft_median_s"] > 0 for runs in result["passes"].values() for p in runs)
    assert "decision on vs off" in (tmp_path / "overhead.md").read_text()


def test_same_engine_overhead_bench_stores_only_the_requests_that_may(tiny_model, tmp_path):
    result = overhead.run_stores_same_engine(
        str(tiny_model), tmp_path, pairs=2, prompt_len=300, output_len=4,
        progress=lambda _: None, in_process=True,
    )  # fmt: skip
    # 2 storing requests of 2 full blocks each reach the disk; the others store nothing.
    assert result["bytes_written"] > 0
    assert len(result["figures"]["stores"]["ttft_s"]) == 2
    assert "stores / no stores" in (tmp_path / "overhead-stores.md").read_text()


def test_bandwidth_bench_checks_the_bytes_it_moves(tmp_path):
    result = bandwidth.run(tmp_path, reps=1, progress=lambda _: None)
    assert all(v[0] > 0 for v in result["gbps"].values())
    assert "plain sequential read" in (tmp_path / "bandwidth.md").read_text()


@pytest.mark.real_model
def test_needle_probe_scores_every_session(tmp_path):
    from kvtier.probe import needles
    from tests.support.models import smollm2

    result = needles.run(
        str(smollm2()),
        tmp_path,
        sessions=2,
        session_tokens=400,
        wave=2,
        engine_blocks=24,
        max_tokens=8,
        progress=lambda _: None,
        in_process=True,
    )
    assert set(result["verdicts"]) == {"amber-0", "basalt-1"}
    assert all(v in {"ok", "mixup", "truncated", "degraded"} for v in result["verdicts"].values())
    answers = json.loads((tmp_path / "needles.json").read_text())["answers"]
    assert len(answers) == 10
    assert all(a["cached_tokens"] > 0 for a in answers), "every revisit must be a restore"
    assert all("baseline_answer" in a for a in answers)
    assert result["identical_answers"] == sum(a["answer"] == a["baseline_answer"] for a in answers)


def test_store_and_checksum_benches_run_as_commands(tmp_path):
    from typer.testing import CliRunner

    from benchmarks.cli import app

    runner = CliRunner()
    raw = tmp_path / "store.json"
    small = ["--total-mib", "4", "--repeats", "1", "--open-records", "200", "--real-records", "20"]
    store = runner.invoke(
        app, ["store", "--dir", str(tmp_path), *small, "--no-cold", "--json", str(raw)]
    )
    assert store.exit_code == 0, store.output
    assert "DiskStore default" in store.output and "contains() ns p50 / p99" in store.output
    assert "DiskStore default, sealed" in store.output and "seal GB/s" in store.output
    assert json.loads(raw.read_text())
    sealed = runner.invoke(
        app, ["store", "--dir", str(tmp_path), *small, "--no-cold", "--sealed-only"]
    )
    assert sealed.exit_code == 0, sealed.output
    assert "seal GB/s" in sealed.output and "DiskStore default, sealed" in sealed.output
    assert "sealed, records of 64 tenants" in sealed.output
    assert "fsync=always" not in sealed.output, "only the sealing figures"
    assert [p.name for p in tmp_path.iterdir()] == ["store.json"], "its work folder is removed"
    checksum = runner.invoke(app, ["checksum", "--repeats", "1"])
    assert checksum.exit_code == 0, checksum.output
    assert "| xxhash.xxh3_64 |" in checksum.output


@pytest.mark.slow
def test_pool_on_disk_bench_runs_as_a_command(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(repo / "src"), str(repo)])
    env = {**os.environ, "PYTHONPATH": path, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    out = tmp_path / "pool.json"
    command = ["pool-on-disk", "--dir", str(tmp_path / "pool"), "--prompts", "2"]
    command = [*command, "--disk-pool", "1GiB", "--ram-pool", "512MiB", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *command],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ram, disk = json.loads(out.read_text())
    assert (ram["kind"], disk["kind"]) == ("ram", "disk")
    assert all(r["restored_tokens_from_host"] > 0 for r in (ram, disk))
    assert disk["pool_file"]["allocated"] < disk["pool_file"]["size"]
    assert ram["restore_s_summary"]["count"] == 7
