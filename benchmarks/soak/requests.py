"""The soak's request figures: outcomes per server, TTFT, wrong outputs, and which requests
missed their bound and whether an injected fault explains it.

A request *missed its bound* when it errored (it got no answer within any bound) or its TTFT
(its latency where no first token was timed) exceeded ``bound_s``. Wrong outputs are counted
on their own and disconnects (a client hanging up on purpose) are neither. Misses of requests
that started during the run's warm-up are counted apart (``over_bound_in_warmup``) and judged
by nothing: the warm-up is there for first compiles and empty caches.

A miss is *attributed* to a fault when the runner listed faults on the request, or when the
request's span overlaps ``[fault.t, fault.end_t + recovery_s]`` of a fault that touches the
request's server: its own (the fault's target is the server), a shared resource's (a Redis
fault touches every server sharing Redis, a disk fault every server whose ``disk_dir`` is the
faulted folder), or the machine's (a ``cpu_burst``, or a fault on ``cpu``, touches everyone).
A request's span is ``[t, t + latency_s]`` (its event carries its start). ``recovery_s`` is
the run's ``recovery_s`` if it has one, else ``DEFAULT_RECOVERY_S``. This is the runner's own
rule, applied again to the faults' windows: a miss the runner listed no fault on but the
windows explain is counted (``attributed_by_windows_only``), as a sign that the two disagree.
A fault whose target names no server, folder or Redis is listed as unplaced and explains
nothing: a label mismatch must not hide a slow request.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable

from benchmarks.soak.events import Log

#: Seconds after a fault's end during which a slow request is still its doing, unless the
#: run says otherwise: the runner's (``benchmarks.soak.faults.RECOVERY_S``; an engine kill's
#: fault already lasts until the restarted server is ready).
DEFAULT_RECOVERY_S = 5.0
#: Kinds, and targets, that touch every server on the machine.
MACHINE_KINDS = frozenset({"cpu_burst"})
MACHINE_TARGETS = frozenset({"cpu", "machine"})
OUTCOMES = ("ok", "wrong", "error", "disconnected")
#: Most requests listed one by one in a figure (the counts are always complete).
LISTED_MAX = 200


def figures(log: Log) -> dict:
    """Outcomes, TTFT, wrong outputs and bound misses of the run's requests."""
    recovery_s = float(log.run.get("recovery_s", DEFAULT_RECOVERY_S))
    touched, unplaced = fault_reach(log)
    outcomes: dict[str, Counter] = {}
    ttft: dict[str, list[float]] = {}
    wrong, misses, no_bound, in_warmup = [], [], 0, 0
    for req in log.requests:
        server = str(req.get("server"))
        outcome = str(req.get("outcome"))
        outcomes.setdefault(server, Counter())[outcome] += 1
        if outcome == "ok" and req.get("ttft_s") is not None:
            ttft.setdefault(server, []).append(float(req["ttft_s"]))
        if outcome == "wrong":
            wrong.append(_brief(req))
            continue
        if outcome not in ("ok", "error"):
            continue
        if req.get("bound_s") is None and outcome == "ok":
            no_bound += 1
            continue
        if outcome == "ok" and _waited_s(req) <= float(req["bound_s"]):
            continue
        if float(req["t"]) < log.warmup_s:
            in_warmup += 1
            continue
        listed = [int(i) for i in req.get("faults") or []]
        found = overlapping_faults(req, log, touched, recovery_s)
        misses.append({**_brief(req), "faults": listed or found, "listed": bool(listed)})
    unattributed = [m for m in misses if not m["faults"]]
    return {
        "total": len(log.requests),
        "by_server": {s: {o: c.get(o, 0) for o in _outcome_names(c)} for s, c in outcomes.items()},
        "by_outcome": dict(sum(outcomes.values(), Counter())),
        "ttft_s": {s: _stats(v) for s, v in sorted(ttft.items())},
        "wrong": len(wrong),
        "wrong_listed": wrong[:LISTED_MAX],
        "over_bound": len(misses),
        "over_bound_attributed": len(misses) - len(unattributed),
        "over_bound_unattributed": len(unattributed),
        "attributed_by_windows_only": sum(1 for m in misses if m["faults"] and not m["listed"]),
        "unattributed_listed": unattributed[:LISTED_MAX],
        "without_bound": no_bound,
        "over_bound_in_warmup": in_warmup,
        "recovery_s": recovery_s,
        "unplaced_faults": unplaced,
    }


def fault_reach(log: Log) -> tuple[dict[int, set[str]], list[dict]]:
    """Servers each fault touches, by fault id; and the faults that touch none."""
    servers = log.run.get("servers", [])
    labels = {str(s.get("label")) for s in servers}
    folder_paths = {str(f.get("label")): _real(f.get("path")) for f in log.run.get("folders", [])}
    on_redis = {str(s["label"]) for s in servers if _shares_redis(s)}
    touched: dict[int, set[str]] = {}
    unplaced = []
    for fault in log.faults:
        kind, target = str(fault.get("kind")), str(fault.get("target"))
        if kind in MACHINE_KINDS or target in MACHINE_TARGETS:
            reach = set(labels)
        elif target in labels:
            reach = {target}
        elif kind.startswith("redis") or "redis" in target.lower():
            reach = set(on_redis)
        else:
            # A folder label, or (a runner that names folders by path) an absolute path.
            path = folder_paths.get(target, _real(target) if target.startswith("/") else "")
            reach = {str(s["label"]) for s in servers if path and _real(s.get("disk_dir")) == path}
        touched[int(fault["id"])] = reach
        if not reach:
            unplaced.append({"id": fault["id"], "kind": kind, "target": target})
    return touched, unplaced


def overlapping_faults(
    req: dict, log: Log, touched: dict[int, set[str]], recovery_s: float
) -> list[int]:
    """Ids of the faults touching the request's server whose window (recovery included)
    overlaps the request's span."""
    start = float(req["t"])
    end = start + float(req.get("latency_s") or 0.0)
    server = str(req.get("server"))
    found = []
    for fault in log.faults:
        if server not in touched.get(int(fault["id"]), ()):
            continue
        f_start = float(fault["t"])
        f_end = float(fault.get("end_t") if fault.get("end_t") is not None else f_start)
        if start <= f_end + recovery_s and f_start <= end:
            found.append(int(fault["id"]))
    return found


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _stats(values: list[float]) -> dict:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values),
    }


def _waited_s(req: dict) -> float:
    ttft = req.get("ttft_s")
    return float(ttft if ttft is not None else req.get("latency_s") or 0.0)


def _brief(req: dict) -> dict:
    keys = ("t", "server", "session", "turn", "outcome", "ttft_s", "latency_s", "bound_s")
    return {**{k: req.get(k) for k in keys}, "error": req.get("error")}


def _outcome_names(counts: Counter) -> list[str]:
    return [*OUTCOMES, *sorted(set(counts) - set(OUTCOMES))]


def _shares_redis(server: dict) -> bool:
    shared = server.get("shared")
    if shared is True:  # the runner's flag: this server's shared tier is the run's Redis
        return True
    text = " ".join(map(str, shared)) if isinstance(shared, list | tuple) else str(shared or "")
    return "redis" in text.lower() or "replica" in str(server.get("role", "")).lower()


def _real(path: object) -> str:
    return os.path.realpath(str(path)) if path else ""
