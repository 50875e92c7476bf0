"""Reading the soak's event log (``events.jsonl``, one JSON object per line).

The runner flushes a line per event, so a run killed mid-write leaves at most one torn last
line: it is dropped and counted (``torn_lines``), not an error, so that a report of the
events that did arrive can still be written. A torn line elsewhere is counted the same way.
Lines are written as events complete (a fault when it ends, a request with its start ``t``),
so each list is sorted by ``t`` after reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Log:
    """The events of one run, by type, each list in file order."""

    run: dict = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)
    crashes: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    end: dict | None = None
    #: Lines that were not a JSON object (a torn write).
    torn_lines: int = 0
    #: Events of a type this reader does not know, by type (kept out of the figures).
    other: dict[str, int] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        """How long the run went: its end event, else its last event, else its plan."""
        if self.end is not None and "t" in self.end:
            return float(self.end["t"])
        last = [float(e["t"]) for kind in (self.requests, self.faults, self.samples) for e in kind]
        if last:
            return max(last)
        return float(self.run.get("duration_s", 0.0))

    @property
    def warmup_s(self) -> float:
        return float(self.run.get("warmup_s", 0.0))


def reference_label(model: str) -> str:
    """The ``sample`` label of the plain vLLM server (no kvtier) that serves ``model`` for the
    oracle: the runner samples it under this name, the report pairs each server with it."""
    return f"reference-{model}"


_LISTS = {"request": "requests", "fault": "faults", "crash": "crashes", "sample": "samples"}


def load(path: Path) -> Log:
    """Parse ``path`` into a ``Log``."""
    log = Log()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                log.torn_lines += 1
                continue
            if not isinstance(event, dict):
                log.torn_lines += 1
                continue
            kind = event.get("type")
            if kind == "run":
                log.run = event
            elif kind == "end":
                log.end = event
            elif kind in _LISTS:
                getattr(log, _LISTS[kind]).append(event)
            else:
                log.other[str(kind)] = log.other.get(str(kind), 0) + 1
    for name in _LISTS.values():
        getattr(log, name).sort(key=lambda e: float(e.get("t") or 0.0))
    return log
