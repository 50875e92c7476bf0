"""The soak's report: figures and the acceptance verdict from an event log, written as
report.md (tables), report.json (the same figures, the verdict included) and soak.png.

The figures come from ``requests`` (outcomes, TTFT, bound misses and their attribution) and
``resources`` (leak trends, the cap, leftovers); ``verdict`` checks them; ``markdown`` and
``plot`` render them. The report reads nothing but the event log, so it can be rendered
again from a saved log (``python -m benchmarks soak-report EVENTS OUT``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.soak import events as event_log
from benchmarks.soak import markdown, plot, requests, resources
from benchmarks.soak.verdict import Verdict, judge

__all__ = ["Verdict", "summarize", "write_report"]


def write_report(events: Path, out_dir: Path) -> Verdict:
    """Read ``events`` (events.jsonl), write report.md, report.json and soak.png into
    ``out_dir``, and return the verdict."""
    log = event_log.load(events)
    verdict = judge(summarize(log))
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"passed": verdict.passed, "failures": verdict.failures, **verdict.summary}
    (out_dir / "report.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (out_dir / "report.md").write_text(markdown.render(verdict))
    plot.draw(log, out_dir / "soak.png", verdict.summary["requests"]["unattributed_listed"])
    return verdict


def summarize(log: event_log.Log) -> dict:
    """Every figure of the report (without the acceptance rows, which ``judge`` adds)."""
    run = {k: v for k, v in log.run.items() if k != "type"}
    by_kind = Counter(str(f.get("kind")) for f in log.faults)
    injected = [c for c in log.crashes if c.get("injected")]
    uninjected = [
        {k: c.get(k) for k in ("t", "server", "returncode", "log_tail")}
        for c in log.crashes
        if not c.get("injected")
    ]
    return {
        "run": run,
        "measured_s": log.duration_s,
        "requests": requests.figures(log),
        "faults": {"total": len(log.faults), "by_kind": dict(sorted(by_kind.items()))},
        "crashes": {"total": len(log.crashes), "injected": len(injected), "uninjected": uninjected},
        "processes": resources.process_figures(log),
        "folders": resources.folder_figures(log),
        "leftovers": resources.leftovers(log),
        "log": {"samples": len(log.samples), "torn_lines": log.torn_lines, "other": log.other},
    }
