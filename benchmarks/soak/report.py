"""The soak's report: figures and the acceptance verdict from an event log, as report.md,
report.json and soak.png."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Verdict:
    """Whether the run met the acceptance, and why not."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def write_report(events: Path, out_dir: Path) -> Verdict:
    """Read ``events`` (events.jsonl), write report.md, report.json and soak.png into
    ``out_dir``, and return the verdict."""
    raise NotImplementedError
