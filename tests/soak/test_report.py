"""The soak's verdict on synthetic event logs: a clean run passes, and each way a run can
break the acceptance fails it with a message naming the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.soak.events import load
from benchmarks.soak.report import summarize, write_report
from benchmarks.soak.verdict import Verdict, judge
from tests.soak.synthetic import CAP_BYTES, LABELS, MIB, Run


def report(run: Run, tmp_path: Path) -> Verdict:
    """The verdict write_report would return, without drawing the plot (most of its time)."""
    return judge(summarize(load(run.write(tmp_path / "events.jsonl"))))


def only_failure(verdict: Verdict, rule: str) -> str:
    assert not verdict.passed
    assert verdict.failures, "a failed verdict names its failures"
    assert all(f.startswith(rule + ":") for f in verdict.failures), verdict.failures
    return verdict.failures[0]


def test_a_clean_run_passes_and_writes_the_three_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    verdict = write_report(Run().write(tmp_path / "events.jsonl"), out)
    assert verdict.passed, verdict.failures
    assert (out / "soak.png").stat().st_size > 0
    saved = json.loads((out / "report.json").read_text())
    assert saved["passed"] is True
    assert saved["requests"]["by_server"]["pair-a"]["ok"] == saved["requests"]["total"] // 4
    assert "**PASSED**" in (out / "report.md").read_text()


def test_a_short_run_lists_the_volume_as_not_applicable(tmp_path: Path) -> None:
    verdict = report(Run(duration_s=600), tmp_path)
    rows = {r["check"]: r for r in verdict.summary["acceptance"]}
    assert rows["volume"]["status"] == "n/a"
    assert verdict.passed


def test_an_hour_run_without_the_volume_fails(tmp_path: Path) -> None:
    verdict = report(Run(duration_s=3600, every_s=30), tmp_path)
    message = only_failure(verdict, "volume")
    assert "faults" in message


def test_a_wrong_output_fails(tmp_path: Path) -> None:
    run = Run()
    run.request(500.0, outcome="wrong", error="differs from the reference")
    assert "1 request" in only_failure(report(run, tmp_path), "wrong outputs")


def test_a_slow_request_outside_any_fault_fails(tmp_path: Path) -> None:
    run = Run()
    run.fault(1, 900.0, "disk_full", "disk-pair")
    run.request(500.0, server="pair-a", ttft_s=3.0, latency_s=3.2)
    only_failure(report(run, tmp_path), "over-bound requests not attributable to a fault")


def test_an_error_outside_any_fault_fails(tmp_path: Path) -> None:
    run = Run()
    run.request(500.0, outcome="error", ttft_s=None, error="500")
    only_failure(report(run, tmp_path), "over-bound requests not attributable to a fault")


@pytest.mark.parametrize(
    ("kind", "target", "server"),
    [
        ("disk_full", "disk-pair", "pair-b"),  # the folder's other server
        ("redis_sigstop", "redis", "rep-a"),  # a replica, through shared Redis
        ("cpu_burst", "cpu", "pair-a"),  # everyone
        ("engine_sigkill", "pair-a", "pair-a"),  # its own server
    ],
)
def test_a_slow_request_in_a_fault_window_is_attributed(
    tmp_path: Path, kind: str, target: str, server: str
) -> None:
    run = Run()
    run.fault(1, 500.0, kind, target, end_t=510.0)
    # Starts within the recovery window after the fault's end.
    run.request(513.0, server=server, ttft_s=3.0, latency_s=5.0)
    verdict = report(run, tmp_path)
    assert verdict.passed, verdict.failures
    assert verdict.summary["requests"]["over_bound_attributed"] == 1


def test_a_slow_request_in_the_warm_up_is_counted_but_not_judged(tmp_path: Path) -> None:
    run = Run()
    run.request(60.0, ttft_s=3.0, latency_s=3.2)
    verdict = report(run, tmp_path)
    assert verdict.passed, verdict.failures
    assert verdict.summary["requests"]["over_bound_in_warmup"] == 1


def test_a_slow_request_after_the_recovery_window_is_not_attributed(tmp_path: Path) -> None:
    run = Run()
    run.fault(1, 500.0, "engine_sigkill", "pair-a", end_t=510.0)
    run.request(520.0, server="pair-a", ttft_s=3.0, latency_s=3.1)
    only_failure(report(run, tmp_path), "over-bound requests not attributable to a fault")


def test_a_slow_request_that_began_before_a_fault_is_attributed(tmp_path: Path) -> None:
    run = Run()
    run.fault(1, 500.0, "disk_full", "disk-pair", end_t=504.0)
    run.request(495.0, server="pair-b", ttft_s=6.0, latency_s=6.2)  # in flight at t=500
    assert report(run, tmp_path).passed


def test_a_fault_on_another_resource_explains_nothing(tmp_path: Path) -> None:
    run = Run()
    run.fault(1, 500.0, "redis_kill", "redis", end_t=510.0)
    run.request(512.0, server="pair-a", ttft_s=3.0, latency_s=3.1)
    only_failure(report(run, tmp_path), "over-bound requests not attributable to a fault")


def test_a_request_the_runner_listed_faults_on_is_attributed(tmp_path: Path) -> None:
    run = Run()
    run.request(500.0, ttft_s=3.0, latency_s=3.2, faults=[7])
    assert report(run, tmp_path).passed


def test_an_uninjected_crash_fails_and_an_injected_kill_does_not(tmp_path: Path) -> None:
    run = Run()
    run.crash(400.0, "pair-a", injected=True)
    run.crash(800.0, "pair-b", injected=False, returncode=-11)
    message = only_failure(report(run, tmp_path), "crashes other than injected kills")
    assert "pair-b" in message and "-11" in message


def test_a_growing_descriptor_count_fails(tmp_path: Path) -> None:
    run = Run()
    run.fds["pair-a"] = lambda t: 40 + int(t / 60)  # one a minute: ~28 over the run
    message = only_failure(report(run, tmp_path), "descriptor leak")
    assert "pair-a" in message


def test_descriptors_flat_after_warm_up_pass(tmp_path: Path) -> None:
    run = Run()
    run.fds["pair-a"] = lambda t: 40 + min(int(t), 100) + (3 if int(t) % 10 == 0 else 0)
    assert report(run, tmp_path).passed


def test_a_short_run_whose_thread_pools_fill_after_warm_up_passes(tmp_path: Path) -> None:
    # As measured in CI: a 100 s run, 8 s of warm-up, a server whose pools start five more
    # threads during its first 30 s and then stay flat. Over the whole window that step reads
    # as +4.4; its later half is flat.
    run = Run(duration_s=100.0, warmup_s=8.0)
    run.threads["pair-a"] = lambda t: 80 + min(5, int(max(t - 8, 0) / 6))
    verdict = report(run, tmp_path)
    assert verdict.passed, verdict.failures
    trend = next(tr for tr in verdict.summary["processes"]["pair-a"]["trends"] if tr["judged"])
    assert trend["later_half_of"] > trend["window_s"]


def test_a_short_run_whose_threads_keep_growing_fails(tmp_path: Path) -> None:
    run = Run(duration_s=100.0, warmup_s=8.0)
    run.threads["pair-a"] = lambda t: 80 + int(t / 5)  # one every 5 s: ~9 in the later half
    message = only_failure(report(run, tmp_path), "thread leak")
    assert "pair-a" in message


def test_a_restart_is_a_new_incarnation_not_a_leak(tmp_path: Path) -> None:
    run = Run()
    run.pids["pair-a"] = lambda t: 2000 if t < 900 else 2001
    run.fds["pair-a"] = lambda t: 40 if t < 900 else 90  # the new process holds more
    verdict = report(run, tmp_path)
    assert verdict.passed, verdict.failures
    assert verdict.summary["processes"]["pair-a"]["incarnations"] == 2


def test_a_growing_process_other_than_a_server_is_not_judged(tmp_path: Path) -> None:
    run = Run()
    run.fds["redis"] = lambda t: 40 + int(t / 60)
    assert report(run, tmp_path).passed


def test_a_restart_loading_until_its_kill_fault_ends_is_not_a_leak(tmp_path: Path) -> None:
    run = Run()
    run.fault(1, 895.0, "engine_sigkill", "pair-a", end_t=1200.0, injected_kill=True)
    run.crash(895.5, "pair-a", injected=True)
    run.pids["pair-a"] = lambda t: 2000 if t < 900 else 2001
    # The new process loads its model (and spawns its engine) until it is ready at 1200.
    run.fds["pair-a"] = lambda t: 40 if t < 900 else 3 + int(min(t - 900, 300) / 2)
    verdict = report(run, tmp_path)
    assert verdict.passed, verdict.failures
    second = verdict.summary["processes"]["pair-a"]["trends"][1]
    assert second["from_t"] >= 1200 + 120


def test_rss_growth_of_ten_percent_fails(tmp_path: Path) -> None:
    run = Run()
    run.rss["rep-b"] = lambda t: int(500 * MIB * (1 + 0.1 * t / 1800))
    message = only_failure(report(run, tmp_path), "RSS growth")
    assert "rep-b" in message


def test_an_hour_run_whose_servers_all_restarted_cannot_show_its_rss_flat(
    tmp_path: Path,
) -> None:
    run = Run(duration_s=3600, every_s=30)
    for n, label in enumerate(LABELS):
        run.pids[label] = lambda t, n=n: 100 * n + int(t // 1000)
    failures = report(run, tmp_path).failures
    assert any(f.startswith("RSS growth: no incarnation spans") for f in failures), failures


def test_a_leftover_shm_region_fails(tmp_path: Path) -> None:
    run = Run()
    run.after_shutdown["shm_regions"] = 1
    only_failure(report(run, tmp_path), "leftover /dev/shm regions")


def test_a_server_process_alive_after_shutdown_fails_naming_it(tmp_path: Path) -> None:
    run = Run()
    run.after_shutdown["servers_alive"] = 1
    run.after_shutdown["survivors"] = [{"pid": 4242, "cmdline": "python -m vllm engine-core"}]
    message = only_failure(report(run, tmp_path), "servers alive after shutdown")
    assert "4242" in message and "engine-core" in message


def test_a_leftover_temp_file_fails(tmp_path: Path) -> None:
    run = Run()
    run.after_shutdown["temp_files"] = 2
    only_failure(report(run, tmp_path), "leftover temp files")


def test_du_over_the_cap_fails(tmp_path: Path) -> None:
    run = Run()
    run.du_bytes = CAP_BYTES + 4096
    message = only_failure(report(run, tmp_path), "disk cap")
    assert str(CAP_BYTES) in message


def test_a_torn_last_line_still_gives_a_report(tmp_path: Path) -> None:
    events = Run().write(tmp_path / "events.jsonl")
    with open(events, "a") as f:
        f.write('{"type": "sample", "t": 18')
    verdict = judge(summarize(load(events)))
    assert verdict.summary["log"]["torn_lines"] == 1
    assert verdict.passed


def test_the_command_exits_1_on_a_failed_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from benchmarks.cli import app

    run = Run(duration_s=600)
    run.request(300.0, outcome="wrong")
    events = run.write(tmp_path / "events.jsonl")
    result = CliRunner().invoke(app, ["soak-report", str(events), str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert (tmp_path / "out" / "report.md").exists()


def test_an_empty_log_fails_and_still_gives_a_report(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("")
    verdict = write_report(events, tmp_path / "out")
    assert any(f.startswith("run started:") for f in verdict.failures), verdict.failures
    assert any(f.startswith("run finished:") for f in verdict.failures), verdict.failures
    assert (tmp_path / "out" / "report.md").exists()
