"""The soak's resource figures from its samples: descriptor, thread and RSS trends per process
incarnation, the disk folders against their caps, and what was left after shutdown.

Leak checks, per process label and incarnation (a new pid is a new incarnation; it starts
from fresh counts, so trends never span a restart):

* An incarnation *settles* at the run's ``warmup_s`` (the first one) or
  ``min(warmup_s, RESTART_SETTLE_S)`` after it was ready (a restarted one: the run is warm
  by then, only the process is new). A restart after an injected kill is ready when the kill
  fault ends (the runner closes it once the new server answers: a restart that loads the
  model for a minute on a busy machine would otherwise look like a leak of 150 fds); any
  other restart is taken as ready at its first sample. Only samples after it count.
* Descriptors and threads: every incarnation with at least ``LEAK_WINDOW_S`` of settled
  samples is judged; its least-squares slope times its settled window (the growth the trend
  says it had) must stay within ``FD_GROWTH_MAX`` / ``THREAD_GROWTH_MAX``. A label none of
  whose incarnations lived that long (a short run, or a server killed often) is judged on
  its longest incarnation with ``MIN_SAMPLES`` settled samples, and the figure says so
  (``short``). A short incarnation is judged on the later half of its settled samples: in
  a run of a minute or two, the engine's lazily started thread pools are still filling
  during the first half (a step of a few threads that then stays flat), and a trend over a
  step is not a leak; a leak keeps growing, so the later half still shows it. A label with
  no such incarnation is not judged (``judged: false``).
* Only kvtier's servers (the run's ``servers``) are judged; other sampled processes (Redis,
  the plain vLLM reference) are shown, not judged: their leaks are not kvtier's.
* RSS: the incarnations whose settled window covers ``RSS_SPAN_FRACTION`` of the run's
  settled time; growth from the median of the first settled ``RSS_EDGE_S`` to the median of
  the last ``RSS_EDGE_S`` (a third of the window each, if shorter) must stay under
  ``RSS_GROWTH_MAX``. Beside each figure, for information only, ``rss_context`` puts its
  split by process role and the plain vLLM reference's growth over the same window.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.soak import rss_context
from benchmarks.soak.events import Log

LEAK_WINDOW_S = 600.0
FD_GROWTH_MAX = 8.0
THREAD_GROWTH_MAX = 4.0
MIN_SAMPLES = 5
RESTART_SETTLE_S = 120.0
RSS_SPAN_FRACTION = 0.75
RSS_EDGE_S = 60.0
RSS_GROWTH_MAX = 0.05


def series(log: Log) -> dict[str, list[list[dict]]]:
    """Per label, its incarnations in order of appearance, each its samples
    ``{t, pid, fds, threads, rss_bytes}`` (and ``by_role`` where logged) in time order."""
    found: dict[str, dict[int, list[dict]]] = {}
    for sample in log.samples:
        for label, proc in (sample.get("processes") or {}).items():
            point = {"t": float(sample["t"]), **proc}
            found.setdefault(label, {}).setdefault(int(proc["pid"]), []).append(point)
    return {label: list(by_pid.values()) for label, by_pid in found.items()}


def process_figures(log: Log) -> dict:
    """Leak figures per label (see the module docstring)."""
    warmup_s = log.warmup_s
    settled_run_s = max(log.duration_s - warmup_s, 0.0)
    servers = {str(s.get("label")) for s in log.run.get("servers", [])}
    out = {}
    by_label = series(log)
    for label, incarnations in by_label.items():
        kills = [f for f in log.faults if f.get("injected_kill") and f.get("target") == label]
        settled = []
        for n, points in enumerate(incarnations):
            if n == 0:
                settle_t = warmup_s
            else:
                ready_t = _ready_t(points[0]["t"], kills)
                settle_t = ready_t + min(warmup_s, RESTART_SETTLE_S)
            settled.append([p for p in points if p["t"] >= settle_t])
        trends, settled_with_trend = [], []
        for n, pts in enumerate(settled):
            if (tr := _trend(pts, incarnations[n][0]["pid"])) is not None:
                trends.append(tr)
                settled_with_trend.append(pts)
        judged = [tr for tr in trends if tr["window_s"] >= LEAK_WINDOW_S]
        short = False
        if not judged:
            candidates = [
                (n, tr) for n, tr in enumerate(trends) if tr["samples"] >= 2 * MIN_SAMPLES
            ]
            if candidates:
                n, longest = max(candidates, key=lambda c: c[1]["window_s"])
                later = _trend(_later_half(settled_with_trend[n]), longest["pid"])
                assert later is not None  # 2 * MIN_SAMPLES points: its half has MIN_SAMPLES
                later["later_half_of"] = longest["window_s"]
                trends[n] = later
                judged, short = [later], True
        is_server = not servers or label in servers
        if not is_server:
            judged, short = [], False
        for tr in trends:
            tr["judged"] = any(tr is j for j in judged)
        rss = [
            _rss_growth(pts, incarnations[n][0]["pid"])
            for n, pts in enumerate(settled)
            if len(pts) >= 2 and _span(pts) >= RSS_SPAN_FRACTION * settled_run_s
        ]
        last = incarnations[-1][-1]
        out[label] = {
            "kvtier_server": is_server,
            "incarnations": len(incarnations),
            "leak_judged": bool(judged),
            "leak_short": short,
            # Every incarnation's trend after warm-up; "judged" marks those checked.
            "trends": trends,
            "rss": rss,
            "last": {k: last.get(k) for k in ("pid", "fds", "threads", "rss_bytes")},
            "max": {
                k: max(p.get(k, 0) for pts in incarnations for p in pts)
                for k in ("fds", "threads", "rss_bytes")
            },
        }
    rss_context.annotate(out, by_label, log.run.get("servers", []))
    return out


def folder_figures(log: Log) -> dict:
    """Each folder's footprint (du) against its cap over every sample."""
    out: dict[str, dict] = {}
    for sample in log.samples:
        for label, f in (sample.get("folders") or {}).items():
            cap, du = int(f["cap_bytes"]), int(f["du_bytes"])
            fig = out.setdefault(
                label,
                {"path": f.get("path"), "cap_bytes": cap, "samples": 0, "samples_over": 0},
            )
            fig["samples"] += 1
            ratio = du / cap if cap else float("inf")
            if du > cap:
                fig["samples_over"] += 1
                fig.setdefault("first_over_t", float(sample["t"]))
            if ratio >= fig.get("max_ratio", -1.0):
                fig.update(
                    max_ratio=ratio,
                    max_du_bytes=du,
                    max_files_bytes=int(f["files_bytes"]),
                    max_dirs_bytes=int(f["dirs_bytes"]),
                    max_t=float(sample["t"]),
                )
            fig["last_du_bytes"] = du
    return out


def leftovers(log: Log) -> dict:
    """/dev/shm regions and temp files at the last sample and after shutdown."""
    last = log.samples[-1] if log.samples else {}
    after = (log.end or {}).get("after_shutdown")
    return {
        "last_sample": {k: last.get(k) for k in ("shm_regions", "temp_files")},
        "after_shutdown": after,
    }


def slope(ts: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` over ``ts`` (per second); 0 for fewer than 2 times."""
    n = len(ts)
    if n < 2:
        return 0.0
    mean_t, mean_v = sum(ts) / n, sum(values) / n
    var = sum((t - mean_t) ** 2 for t in ts)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in zip(ts, values, strict=True)) / var


def _ready_t(first_t: float, kills: list[dict]) -> float:
    """When an incarnation first sampled at ``first_t`` was ready: the end of the last kill
    of its label that began before it (the new process appears while the kill's fault is
    open), else ``first_t``."""
    before = [f for f in kills if float(f["t"]) <= first_t]
    if not before:
        return first_t
    last = max(before, key=lambda f: float(f["t"]))
    end_t = last.get("end_t")
    return max(first_t, float(end_t)) if end_t is not None else first_t


def _later_half(points: list[dict]) -> list[dict]:
    return points[len(points) // 2 :]


def _span(points: list[dict]) -> float:
    return points[-1]["t"] - points[0]["t"] if points else 0.0


def _trend(points: list[dict], pid: int) -> dict | None:
    if len(points) < 2:
        return None
    ts = [p["t"] for p in points]
    window = _span(points)
    return {
        "pid": pid,
        "from_t": ts[0],
        "window_s": window,
        "samples": len(points),
        "fd_growth": slope(ts, [p["fds"] for p in points]) * window,
        "thread_growth": slope(ts, [p["threads"] for p in points]) * window,
        "rss_growth_bytes": slope(ts, [p["rss_bytes"] for p in points]) * window,
    }


def _rss_growth(points: list[dict], pid: int) -> dict:
    span = _span(points)
    window = rss_context.Window(points[0]["t"], points[-1]["t"], min(RSS_EDGE_S, span / 3))
    growth = window.growth(points, lambda p: p["rss_bytes"])
    assert growth is not None  # the window's edges are samples of its own
    return {
        "pid": pid,
        "window_s": span,
        "from_t": window.from_t,
        "to_t": window.to_t,
        "edge_s": window.edge_s,
        **growth,
    }
