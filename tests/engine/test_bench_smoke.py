"""Small, fast runs of every benchmark and the needle probe, so none of them can rot.

Figures from these runs mean nothing (tiny model, one repetition, engines in one process);
the assertions check that each tool runs end to end and writes its table, data and plot.
"""

import json

import pytest

from kvtier.devtools.bench import bandwidth, concurrent, overhead, ttft

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
    )
    assert set(result["passes"]) == {"off", "on"}
    assert all(p["ttft_median_s"] > 0 for runs in result["passes"].values() for p in runs)
    assert "kvtier on" in (tmp_path / "overhead.md").read_text()


def test_bandwidth_bench_checks_the_bytes_it_moves(tmp_path):
    result = bandwidth.run(tmp_path, reps=1, progress=lambda _: None)
    assert all(v[0] > 0 for v in result["gbps"].values())
    assert "plain sequential read" in (tmp_path / "bandwidth.md").read_text()


@pytest.mark.real_model
def test_needle_probe_scores_every_session(tmp_path):
    from kvtier.devtools.models import smollm2
    from kvtier.devtools.probe import needles

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
