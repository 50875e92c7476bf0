"""Beside each judged RSS figure, the report shows its split by process role and the plain
vLLM server's growth over the same window; the verdict reads neither, and a log without the
split still reports."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.soak import markdown
from benchmarks.soak.events import load, reference_label
from benchmarks.soak.report import summarize
from benchmarks.soak.verdict import Verdict, judge
from tests.soak.synthetic import MIB, Run

REFERENCE = reference_label("tiny")  # every synthetic server serves "tiny"
#: A process's RSS by role at time t, as ``Run.rss_by_role`` takes it.
RolesAt = Callable[[float], dict[str, int]]
PUBLISHED_LOG = Path(__file__).parents[2] / "docs" / "bench" / "soak" / "events.jsonl.gz"


def report(run: Run, tmp_path: Path) -> Verdict:
    return judge(summarize(load(run.write(tmp_path / "events.jsonl"))))


def growing_engine(engine_growth_mib: float, top_mib: float = 300) -> RolesAt:
    """RSS by role of a server whose engine core grows by ``engine_growth_mib`` over the
    30-minute synthetic run (front-end flat)."""
    return lambda t: {
        "top": int(top_mib * MIB),
        "VLLM::EngineCor": int((200 + engine_growth_mib * t / 1800) * MIB),
    }


def with_reference(run: Run, server: str, server_mib: float, reference_mib: float) -> Run:
    """``server`` and the plain vLLM reference, each growing in its engine core."""
    run.other_labels.append(REFERENCE)
    for label, growth_mib in ((server, server_mib), (REFERENCE, reference_mib)):
        by_role = growing_engine(growth_mib)
        run.rss_by_role[label] = by_role
        run.rss[label] = lambda t, r=by_role: sum(r(t).values())
    return run


def only_rss(verdict: Verdict, label: str) -> dict:
    (figure,) = verdict.summary["processes"][label]["rss"]
    return figure


def test_the_reference_growth_over_the_same_window_gives_the_excess(tmp_path: Path) -> None:
    figure = only_rss(report(with_reference(Run(), "rep-b", 100, 80), tmp_path), "rep-b")
    ref = figure["reference"]
    assert ref["label"] == REFERENCE
    # Medians of the first and last minute of 1680 s settled: the growth is (1680 - 60) /
    # 1800 of the run's, for both.
    assert ref["growth_bytes"] == pytest.approx(80 * MIB * 1620 / 1800, rel=0.01)
    assert ref["excess_bytes"] == pytest.approx(20 * MIB * 1620 / 1800, rel=0.01)
    assert ref["excess_bytes"] == figure["growth_bytes"] - ref["growth_bytes"]


def test_the_growth_is_split_by_role_and_each_role_has_its_excess(tmp_path: Path) -> None:
    figure = only_rss(report(with_reference(Run(), "rep-b", 100, 80), tmp_path), "rep-b")
    roles = figure["by_role"]
    assert set(roles) == {"top", "VLLM::EngineCor"}
    assert roles["top"]["growth_bytes"] == 0
    assert roles["VLLM::EngineCor"]["growth_bytes"] == pytest.approx(figure["growth_bytes"])
    ref_roles = figure["reference"]["by_role"]
    assert ref_roles["top"]["excess_bytes"] == 0
    assert ref_roles["VLLM::EngineCor"]["excess_bytes"] == pytest.approx(
        figure["reference"]["excess_bytes"]
    )


def test_the_reference_is_compared_only_over_the_servers_window(tmp_path: Path) -> None:
    """rep-b restarts at t=200, so its window starts at 320; the reference's step of
    100 MiB at t=250 is in the reference's own window, not in rep-b's."""
    run = with_reference(Run(), "rep-b", 0, 0)
    run.pids["rep-b"] = lambda t: 1001 if t < 200 else 2001

    def stepped(t: float) -> dict[str, int]:
        return {"top": 300 * MIB, "VLLM::EngineCor": (200 + (100 if t >= 250 else 0)) * MIB}

    run.rss_by_role[REFERENCE] = stepped
    run.rss[REFERENCE] = lambda t: sum(stepped(t).values())
    verdict = report(run, tmp_path)
    figure = only_rss(verdict, "rep-b")
    assert figure["pid"] == 2001 and figure["from_t"] == 320
    assert figure["reference"]["growth_bytes"] == 0
    assert only_rss(verdict, REFERENCE)["growth_bytes"] == 100 * MIB


def test_a_reference_restarted_in_the_window_is_not_compared(tmp_path: Path) -> None:
    run = with_reference(Run(), "rep-b", 100, 80)
    run.pids[REFERENCE] = lambda t: 5000 if t < 900 else 5001
    figure = only_rss(report(run, tmp_path), "rep-b")
    assert figure["reference"] == {"label": REFERENCE, "note": "restarted in the window"}


def test_the_context_changes_no_verdict(tmp_path: Path) -> None:
    """rep-b grows 20%: it fails alike whether plain vLLM grew as much or not at all."""
    (tmp_path / "alike").mkdir()
    (tmp_path / "flat").mkdir()
    alike = report(with_reference(Run(), "rep-b", 100, 100), tmp_path / "alike")
    flat = report(with_reference(Run(), "rep-b", 100, 0), tmp_path / "flat")
    assert not alike.passed
    assert alike.failures == flat.failures
    assert alike.summary["acceptance"] == flat.summary["acceptance"]


def test_a_log_without_roles_or_reference_still_reports(tmp_path: Path) -> None:
    verdict = report(Run(), tmp_path)
    figure = only_rss(verdict, "rep-b")
    assert figure["by_role"] == {}
    assert "reference" in figure and figure["reference"]["note"] == "not sampled in the window"
    text = markdown.render(verdict)
    assert "The log has no RSS split by process role" in text
    assert f"{REFERENCE}: not sampled in the window" in text


def test_the_report_shows_the_excess_and_the_roles(tmp_path: Path) -> None:
    text = markdown.render(report(with_reference(Run(), "rep-b", 100, 80), tmp_path))
    row = next(
        line
        for line in text.splitlines()
        if line.startswith("| rep-b | 1001 |") and f"| {REFERENCE} |" in line
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5:] == ["+90", "+17.7%", REFERENCE, "+72", "+14.2%", "+18"]
    role_row = next(line for line in text.splitlines() if "| VLLM::EngineCor |" in line)
    assert role_row.startswith("| rep-b | 1001 | VLLM::EngineCor | 1 |")
    assert role_row.endswith("| +72 | +18 |")


@pytest.mark.skipif(not PUBLISHED_LOG.exists(), reason="the published hour log is not here")
def test_the_published_hour_log_without_roles_still_reports(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    with gzip.open(PUBLISHED_LOG, "rb") as src, open(events, "wb") as dst:
        shutil.copyfileobj(src, dst)
    verdict = judge(summarize(load(events)))
    figure = only_rss(verdict, "rep-b")
    assert figure["by_role"] == {}
    assert figure["reference"]["label"] == "reference-tiny-llama"
    assert figure["growth"] >= 0.05 and not verdict.passed  # the rule is unchanged
    assert "| rep-b | 5629 |" in markdown.render(verdict)
