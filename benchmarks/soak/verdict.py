"""The soak's acceptance, checked on the report's figures.

Each check is a row (name, ``pass`` | ``fail`` | ``n/a``, detail); the run passes when none
fails. Every failure message starts with the check's name, so a reader (and a test) knows
which rule broke. The volume rule (faults, fault kinds, requests) applies only to runs
planned for at least ``VOLUME_MIN_DURATION_S``; shorter runs list it as ``n/a``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.soak import resources

VOLUME_MIN_DURATION_S = 3600.0
MIN_FAULTS = 1000
MIN_FAULT_KINDS = 8
MIN_REQUESTS = 3000


@dataclass
class Verdict:
    """Whether the run met the acceptance, and why not."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def judge(summary: dict) -> Verdict:
    """Check ``summary`` (the report's figures); ``summary['acceptance']`` gets the rows."""
    rows: list[dict] = []

    def row(name: str, problems: list[str], detail: str, applies: bool = True) -> None:
        status = "n/a" if not applies else ("fail" if problems else "pass")
        rows.append({"check": name, "status": status, "detail": detail, "problems": problems})

    if not summary["run"]:
        row("run started", ["no run line: not a soak event log, or the run never started"], "")
    req = summary["requests"]
    row(
        "wrong outputs",
        [f"{req['wrong']} request(s) answered wrongly"] if req["wrong"] else [],
        f"{req['wrong']} of {req['total']}",
    )
    unattributed = req["over_bound_unattributed"]
    row(
        "over-bound requests not attributable to a fault",
        [f"{unattributed} request(s) over their bound with no fault to explain them"]
        if unattributed
        else [],
        f"{req['over_bound']} over bound, {req['over_bound_attributed']} attributed",
    )
    crashes = summary["crashes"]
    row(
        "crashes other than injected kills",
        [
            f"{c.get('server')} exited with {c.get('returncode')} at t={c.get('t')}"
            for c in crashes["uninjected"]
        ],
        f"{crashes['total']} exits, {crashes['injected']} injected",
    )
    _leak_rows(summary, row)
    _shutdown_rows(summary, row)
    _cap_row(summary, row)
    _volume_row(summary, row)
    failures = [f"{r['check']}: {p}" for r in rows if r["status"] == "fail" for p in r["problems"]]
    summary["acceptance"] = [{k: r[k] for k in ("check", "status", "detail")} for r in rows]
    return Verdict(passed=not failures, failures=failures, summary=summary)


def _leak_rows(summary: dict, row) -> None:
    # An hour's run must show its trends: there a label with nothing to judge fails (the
    # schedule killed it too often to tell); a shorter run judges what it has and says so.
    full_run = _planned_s(summary) >= VOLUME_MIN_DURATION_S
    fd, thread, rss, notes = [], [], [], []
    unjudged = []
    procs = {k: f for k, f in summary["processes"].items() if f["kvtier_server"]}
    for label, fig in procs.items():
        if not fig["leak_judged"]:
            unjudged.append(label)
            notes.append(
                f"{label} not judged (no incarnation with {2 * resources.MIN_SAMPLES} "
                "samples after warm-up)"
            )
        elif fig["leak_short"]:
            tr = next(tr for tr in fig["trends"] if tr["judged"])
            notes.append(
                f"{label} judged on the later {tr['window_s']:.0f} s of its longest "
                f"incarnation ({tr['later_half_of']:.0f} s)"
            )
        for tr in (tr for tr in fig["trends"] if tr["judged"]):
            where = f"{label} pid {tr['pid']} over {tr['window_s']:.0f} s"
            if tr["fd_growth"] > resources.FD_GROWTH_MAX:
                fd.append(
                    f"{where}: +{tr['fd_growth']:.1f} fds (at most +{resources.FD_GROWTH_MAX:g})"
                )
            if tr["thread_growth"] > resources.THREAD_GROWTH_MAX:
                thread.append(
                    f"{where}: +{tr['thread_growth']:.1f} threads "
                    f"(at most +{resources.THREAD_GROWTH_MAX:g})"
                )
        for g in fig["rss"]:
            if g["growth"] >= resources.RSS_GROWTH_MAX:
                rss.append(
                    f"{label} pid {g['pid']} over {g['window_s']:.0f} s: "
                    f"{g['growth']:+.1%} (must stay under +{resources.RSS_GROWTH_MAX:.0%})"
                )
    if full_run:
        why = [f"{label} not judged: no incarnation lived long enough" for label in unjudged]
        why += [] if procs else ["no kvtier server was ever sampled"]
        fd += why
        thread += why
    judged = any(f["leak_judged"] for f in procs.values())
    detail = "; ".join(notes) or (
        f"every label judged on incarnations of {resources.LEAK_WINDOW_S:g} s or more"
    )
    row("descriptor leak", fd, detail, applies=judged or full_run)
    row("thread leak", thread, detail, applies=judged or full_run)
    rss_judged = sum(len(f["rss"]) for f in procs.values())
    if full_run and not rss_judged:
        rss.append(
            f"no incarnation spans {resources.RSS_SPAN_FRACTION:.0%} of the run "
            "after warm-up (no samples, or every server restarted): the growth cannot be told"
        )
    row(
        "RSS growth",
        rss,
        f"{rss_judged} incarnation(s) spanning most of the run",
        applies=bool(rss_judged) or full_run,
    )


def _planned_s(summary: dict) -> float:
    return float(summary["run"].get("duration_s") or 0.0)


def _shutdown_rows(summary: dict, row) -> None:
    after = summary["leftovers"]["after_shutdown"]
    if after is None:
        row("run finished", ["no end event (the run stopped early or the log is torn)"], "")
        return
    for key, name in (
        ("shm_regions", "leftover /dev/shm regions"),
        ("temp_files", "leftover temp files"),
        ("servers_alive", "servers alive after shutdown"),
    ):
        n = int(after.get(key) or 0)
        problem = f"{n} after shutdown"
        if key == "servers_alive" and after.get("survivors"):
            problem += ": " + "; ".join(
                f"pid {p['pid']} ({str(p['cmdline'])[:80]})" for p in after["survivors"]
            )
        row(name, [problem] if n else [], f"{n} after shutdown")


def _cap_row(summary: dict, row) -> None:
    problems, details = [], []
    for label, f in summary["folders"].items():
        details.append(f"{label} max {f['max_ratio']:.1%} of the cap")
        if f["samples_over"]:
            problems.append(
                f"{label} du {f['max_du_bytes']} > cap {f['cap_bytes']} bytes at "
                f"{f['samples_over']} of {f['samples']} samples (first at t={f['first_over_t']})"
            )
    row(
        "disk cap",
        problems,
        "; ".join(details) or "no folder sampled",
        applies=bool(summary["folders"]),
    )


def _volume_row(summary: dict, row) -> None:
    planned = _planned_s(summary)
    faults, kinds = summary["faults"]["total"], len(summary["faults"]["by_kind"])
    total = summary["requests"]["total"]
    problems = []
    if faults < MIN_FAULTS:
        problems.append(f"{faults} faults (at least {MIN_FAULTS})")
    if kinds < MIN_FAULT_KINDS:
        problems.append(f"{kinds} fault kinds (at least {MIN_FAULT_KINDS})")
    if total < MIN_REQUESTS:
        problems.append(f"{total} requests (at least {MIN_REQUESTS})")
    detail = f"{faults} faults of {kinds} kinds, {total} requests"
    if planned < VOLUME_MIN_DURATION_S:
        detail += f" (a {planned:.0f} s run: the volume applies to runs of an hour)"
    row("volume", problems, detail, applies=planned >= VOLUME_MIN_DURATION_S)
