"""Scoring of the needle probe: tells a truncated restore, a mix-up and a model miss apart.

Each session carries five needles (a code per depth). For every question the answer is
classified against the session's own code and every other session's codes:

* ``found``: the answer contains this needle's code;
* ``mixup``: it contains a code of another session (a restore served another session's KV);
* ``miss``: neither.

A session's verdict after restore compares with the model-only baseline (the same prompts
without offloading), so model weakness is never blamed on the cache:

* ``ok``: every needle the baseline found is found after restore;
* ``mixup``: any answer carries another session's code;
* ``truncated``: the needles lost after restore (found by the baseline) are the deepest ones
  only — what a restore that dropped the tail of the prefix produces;
* ``degraded``: other losses.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
_NUMBER = re.compile(r"\d{4,}")


@dataclass(frozen=True)
class Needle:
    session: str
    depth: float
    code: str


def classify(answer: str, needle: Needle, all_needles: Sequence[Needle]) -> str:
    """``found`` / ``mixup`` / ``miss`` for one answer."""
    numbers = set(_NUMBER.findall(answer))
    if needle.code in numbers:
        return "found"
    foreign = {n.code for n in all_needles if n.session != needle.session}
    return "mixup" if numbers & foreign else "miss"


def session_verdict(baseline: Mapping[float, str], restored: Mapping[float, str]) -> str:
    """Verdict of one session from per-depth classes (depth -> found/mixup/miss)."""
    if "mixup" in restored.values():
        return "mixup"
    lost = sorted(d for d, c in baseline.items() if c == "found" and restored.get(d) != "found")
    if not lost:
        return "ok"
    deeper_found = [d for d, c in restored.items() if c == "found" and d > lost[0]]
    return "degraded" if deeper_found else "truncated"
