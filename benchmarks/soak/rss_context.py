"""What stands beside each RSS growth figure of the soak (information only: the verdict reads
none of it): the growth split by process role, and the growth of the plain vLLM server over
the same window.

A server's RSS is summed over its process tree: vLLM's API front-end (``top``), its engine
core (``VLLM::EngineCor``), the model runner (``VLLM::Worker``, where the KV cache and the
connector's worker side live) and any helpers. An hour's growth can be kvtier's or vLLM's own;
the reference server of the same model (vLLM without kvtier, same settings, same machine,
same minutes) shows vLLM's own, so the figure that matters for kvtier is the *excess*: the
server's growth in MiB minus the reference's over the same window. MiB, not %: a server and
its reference start from different sizes (kvtier's host pool, a differently sized KV cache),
so the same MiB are a different share of each.

Every growth here is the judged figure's rule (``resources``): median of the samples in the
window's first ``edge_s`` against the median of its last ``edge_s``. The per-role split needs
a log whose samples carry ``by_role`` (EVENTS.md); older logs give the reference comparison
only. A reference that restarted inside the window is not compared: its fresh process would
read as a drop.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from benchmarks.soak.events import reference_label


def annotate(
    figures: dict[str, dict], series: Mapping[str, list[list[dict]]], servers: Sequence[dict]
) -> None:
    """Add ``by_role`` (each role's growth) to every RSS figure of ``figures`` (as
    ``resources.process_figures`` builds them) and ``reference`` (the plain vLLM server's
    growth over the same window, with the excess) to those of kvtier servers."""
    models = {str(s.get("label")): s.get("model") for s in servers}
    for label, fig in figures.items():
        incarnations = {int(points[0]["pid"]): points for points in series.get(label, [])}
        reference = reference_label(str(models[label])) if label in models else None
        for growth in fig["rss"]:
            window = Window(growth["from_t"], growth["to_t"], growth["edge_s"])
            points = window.select(incarnations.get(int(growth["pid"]), []))
            growth["by_role"] = roles_growth(points, window)
            if fig["kvtier_server"] and reference is not None:
                growth["reference"] = reference_growth(
                    reference, series.get(reference, []), window, growth
                )


@dataclass(frozen=True, slots=True)
class Window:
    """A judged figure's window: samples in ``[from_t, to_t]``, compared over the first and
    the last ``edge_s`` of it."""

    from_t: float
    to_t: float
    edge_s: float

    def select(self, points: Sequence[dict]) -> list[dict]:
        return [p for p in points if self.from_t <= p["t"] <= self.to_t]

    def growth(self, points: Sequence[dict], rss: Callable[[dict], int | None]) -> dict | None:
        """``rss(point)``'s growth over the window (points where it is None are left out);
        None when either edge has no value."""
        values = [(p["t"], v) for p in points if (v := rss(p)) is not None]
        first = [v for t, v in values if t <= self.from_t + self.edge_s]
        last = [v for t, v in values if t >= self.to_t - self.edge_s]
        if not first or not last:
            return None
        first_bytes, last_bytes = statistics.median(first), statistics.median(last)
        return {
            "first_bytes": first_bytes,
            "last_bytes": last_bytes,
            "growth_bytes": last_bytes - first_bytes,
            "growth": (last_bytes - first_bytes) / first_bytes if first_bytes else 0.0,
        }


def roles_growth(points: Sequence[dict], window: Window) -> dict[str, dict]:
    """Each role's growth over ``window`` (``count``: most processes of that role in one
    sample); empty for samples without ``by_role``. A role missing from either edge (a
    helper that came or went) is left out."""
    roles: dict[str, int] = {}
    for p in points:
        for role, usage in (p.get("by_role") or {}).items():
            roles[role] = max(roles.get(role, 0), int(usage.get("count", 1)))
    out = {}
    for role, count in roles.items():
        growth = window.growth(points, lambda p, r=role: _role_rss(p, r))
        if growth is not None:
            out[role] = {"count": count, **growth}
    return out


def reference_growth(
    label: str, incarnations: Sequence[list[dict]], window: Window, server: dict
) -> dict:
    """The reference's growth over the server's ``window`` and the server's excess over it
    (in bytes), per role where both have the role; ``note`` says why there is no figure."""
    points = [p for points in incarnations for p in window.select(points)]
    points.sort(key=lambda p: p["t"])
    if not points:
        return {"label": label, "note": "not sampled in the window"}
    if len({p["pid"] for p in points}) > 1:
        return {"label": label, "note": "restarted in the window"}
    growth = window.growth(points, lambda p: p["rss_bytes"])
    if growth is None:
        return {"label": label, "note": "not sampled at both ends of the window"}
    by_role = roles_growth(points, window)
    for role, fig in by_role.items():
        if role in server.get("by_role", {}):
            fig["excess_bytes"] = server["by_role"][role]["growth_bytes"] - fig["growth_bytes"]
    return {
        "label": label,
        "pid": points[0]["pid"],
        **growth,
        "excess_bytes": server["growth_bytes"] - growth["growth_bytes"],
        "by_role": by_role,
    }


def _role_rss(point: dict, role: str) -> int | None:
    usage = (point.get("by_role") or {}).get(role)
    return None if usage is None else int(usage["rss_bytes"])
