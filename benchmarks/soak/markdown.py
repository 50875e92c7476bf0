"""report.md: the verdict, then one table per figure of ``report.summarize``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from benchmarks.soak import requests, resources, sample
from benchmarks.soak.verdict import Verdict

MIB = 1 << 20
#: Most requests a table lists one by one.
ROWS_MAX = 30


def render(verdict: Verdict) -> str:
    s = verdict.summary
    run, req = s["run"], s["requests"]
    out = [
        "# kvtier soak report",
        "",
        f"**{'PASSED' if verdict.passed else 'FAILED'}**"
        + (f": {len(verdict.failures)} failure(s)" if verdict.failures else ""),
        "",
        *[f"- {f}" for f in verdict.failures],
        "",
        f"Command: `{run.get('command', '?')}`  ",
        f"Started {run.get('started', '?')}, git {run.get('git_rev', '?')}, "
        f"seed {run.get('seed', '?')}, machine {run.get('machine', '?')}  ",
        f"Planned {run.get('duration_s', '?')} s (warm-up {run.get('warmup_s', '?')} s), "
        f"measured {s['measured_s']:.0f} s, {s['log']['samples']} samples"
        + (f", {s['log']['torn_lines']} torn log line(s)" if s["log"]["torn_lines"] else ""),
        *(
            [f"Fault kinds left out: {run['fault_kinds_left_out']}"]
            if run.get("fault_kinds_left_out")
            else []
        ),
        "",
        "## Acceptance",
        "",
        *_table(
            ["check", "status", "detail"],
            [[r["check"], r["status"], r["detail"]] for r in s["acceptance"]],
        ),
        "",
        "## Requests by server and outcome",
        "",
        *_requests_table(req),
        "",
        f"Over their bound (errored, or TTFT above bound_s): {req['over_bound']}; attributed to "
        f"a fault: {req['over_bound_attributed']}; not attributable: "
        f"{req['over_bound_unattributed']} (recovery window {req['recovery_s']:g} s; explained "
        f"by the fault windows where the runner listed none: "
        f"{req['attributed_by_windows_only']}). "
        f"Wrong outputs: {req['wrong']}. Without a bound: {req['without_bound']}. Over their "
        f"bound in warm-up (not judged): {req['over_bound_in_warmup']}.",
        "",
        *_request_list(
            "Not attributable", req["unattributed_listed"], req["over_bound_unattributed"]
        ),
        *_request_list("Wrong outputs", req["wrong_listed"], req["wrong"]),
        "## TTFT per server (ok requests)",
        "",
        *_table(
            ["server", "count", "p50 s", "p95 s", "max s"],
            [
                [k, v["count"], f"{v['p50']:.3f}", f"{v['p95']:.3f}", f"{v['max']:.3f}"]
                for k, v in req["ttft_s"].items()
            ],
        ),
        "",
        "## Faults by kind",
        "",
        *_table(["kind", "count"], [[k, n] for k, n in s["faults"]["by_kind"].items()]),
        "",
        f"Total {s['faults']['total']}."
        + (
            f" Unplaced (their target names no server, folder or Redis; they explain no "
            f"request): {_unplaced(req['unplaced_faults'])}."
            if req["unplaced_faults"]
            else ""
        ),
        "",
        "## Crashes",
        "",
        f"{s['crashes']['total']} server exits, {s['crashes']['injected']} injected.",
        "",
        *[
            f"- uninjected: {c['server']} rc {c['returncode']} at t={c['t']}\n\n```\n"
            f"{(c.get('log_tail') or '').strip()[-2000:]}\n```\n"
            for c in s["crashes"]["uninjected"]
        ],
        "## Disk folders against their caps (du -s, files and folders)",
        "",
        *_folders_table(s["folders"]),
        "",
        "## Processes (summed over each server and its children)",
        "",
        *_processes_tables(s["processes"]),
        "## Leftovers",
        "",
        *_leftovers(s["leftovers"]),
        "",
        "## How the checks are defined",
        "",
        f"- Leaks, per incarnation (a new pid): samples after warm-up (restarts: "
        f"min(warm-up, {resources.RESTART_SETTLE_S:g} s) after their first sample); "
        f"incarnations with {resources.LEAK_WINDOW_S:g} s of them are judged (else the "
        f"longest with {2 * resources.MIN_SAMPLES} samples, marked short, on the later half "
        "of them: the first half of a short one is still warm-up): least-squares slope x "
        f"window <= {resources.FD_GROWTH_MAX:g} fds and {resources.THREAD_GROWTH_MAX:g} "
        "threads.",
        f"- RSS: incarnations spanning {resources.RSS_SPAN_FRACTION:.0%} of the settled run; "
        f"median of the first vs the last {resources.RSS_EDGE_S:g} s; growth under "
        f"{resources.RSS_GROWTH_MAX:.0%}.",
        "- A request over its bound is attributed when the runner listed faults on it, or its "
        "span overlaps [t, end_t + recovery] of a fault on its server, on Redis (replicas), on "
        "its disk folder, or a cpu burst.",
        "",
    ]
    return "\n".join(out)


def _unplaced(faults: list[dict]) -> str:
    return ", ".join(f"{f['id']} ({f['kind']} on {f['target']})" for f in faults)


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _requests_table(req: dict) -> list[str]:
    names = list(requests.OUTCOMES)
    for counts in req["by_server"].values():
        names += [o for o in counts if o not in names]
    rows = [
        [server, *(c.get(o, 0) for o in names), sum(c.values())]
        for server, c in sorted(req["by_server"].items())
    ]
    rows.append(["all", *(req["by_outcome"].get(o, 0) for o in names), req["total"]])
    return _table(["server", *names, "total"], rows)


def _request_list(title: str, listed: list[dict], total: int) -> list[str]:
    if not listed:
        return []
    shown = listed[:ROWS_MAX]
    rows = [
        [
            _num(r["t"], 1),
            r["server"],
            r["session"],
            r["turn"],
            r["outcome"],
            _num(r["ttft_s"], 3),
            _num(r["bound_s"], 3),
            (r.get("error") or "").replace("|", "/").replace("\n", " ")[:80],
        ]
        for r in shown
    ]
    return [
        f"{title}: the first {len(shown)} of {total} (report.json lists up to "
        f"{requests.LISTED_MAX}):",
        "",
        *_table(["t", "server", "session", "turn", "outcome", "ttft s", "bound s", "error"], rows),
        "",
    ]


def _num(value: object, digits: int) -> str:
    return "" if value is None else f"{float(value):.{digits}f}"


def _folders_table(folders: dict) -> list[str]:
    rows = [
        [
            label,
            f"{f['cap_bytes'] / MIB:.1f}",
            f"{f['max_du_bytes'] / MIB:.2f}",
            f"{f['max_files_bytes'] / MIB:.2f}",
            f"{f['max_dirs_bytes'] / MIB:.2f}",
            f"{f['max_ratio']:.1%}",
            f"{f['last_du_bytes'] / MIB:.2f}",
            f"{f['samples_over']} / {f['samples']}",
        ]
        for label, f in folders.items()
    ]
    return _table(
        [
            "folder",
            "cap MiB",
            "max du MiB",
            "files MiB (at max)",
            "dirs MiB (at max)",
            "max du/cap",
            "last du MiB",
            "samples over",
        ],
        rows,
    )


def _judged(fig: dict) -> str:
    if not fig["kvtier_server"]:
        return "not a kvtier server"
    if not fig["leak_judged"]:
        return "nothing to judge"
    return "short incarnations" if fig["leak_short"] else "judged"


def _processes_tables(procs: dict) -> list[str]:
    rows = [
        [
            label,
            f["incarnations"],
            f["last"]["fds"],
            f["max"]["fds"],
            f["last"]["threads"],
            f["max"]["threads"],
            f"{(f['last']['rss_bytes'] or 0) / MIB:.0f}",
            f"{f['max']['rss_bytes'] / MIB:.0f}",
            _judged(f),
        ]
        for label, f in procs.items()
    ]
    out = _table(
        [
            "label",
            "incarnations",
            "fds last",
            "fds max",
            "threads last",
            "threads max",
            "RSS MiB last",
            "RSS MiB max",
            "leak check",
        ],
        rows,
    )
    trends = [
        [
            label,
            tr["pid"],
            f"{tr['from_t']:.0f}",
            f"{tr['window_s']:.0f}",
            tr["samples"],
            f"{tr['fd_growth']:+.1f}",
            f"{tr['thread_growth']:+.1f}",
            f"{tr['rss_growth_bytes'] / MIB:+.1f}",
            ("yes, short" if f["leak_short"] else "yes") if tr["judged"] else "no",
        ]
        for label, f in procs.items()
        for tr in f["trends"]
    ]
    out += [
        "",
        "Trends after warm-up, per incarnation (least-squares slope x window):",
        "",
        *_table(
            [
                "label",
                "pid",
                "from t",
                "window s",
                "samples",
                "fds",
                "threads",
                "RSS MiB",
                "judged",
            ],
            trends,
        ),
    ]
    out += ["", *_rss_tables(procs), ""]
    return out


def _rss_tables(procs: dict) -> list[str]:
    """The judged RSS figures, each beside plain vLLM's growth over the same window, then
    split by process role where the log has the split (``rss_context``)."""
    rows = []
    for label, f in procs.items():
        for g in f["rss"]:
            ref = g.get("reference") or {}
            rows.append(
                [
                    label,
                    g["pid"],
                    f"{g['window_s']:.0f}",
                    f"{g['first_bytes'] / MIB:.0f}",
                    f"{g['last_bytes'] / MIB:.0f}",
                    f"{g['growth_bytes'] / MIB:+.0f}",
                    f"{g['growth']:+.1%}",
                    *_reference_cells(ref),
                ]
            )
    out = [
        "RSS growth (medians of the first and last minute after warm-up), beside the plain "
        "vLLM server of the same model over the same window (information only: the check "
        "reads the growth column alone):",
        "",
        *_table(
            [
                "label",
                "pid",
                "window s",
                "first MiB",
                "last MiB",
                "growth MiB",
                "growth",
                "plain vLLM",
                "its growth MiB",
                "its growth",
                "excess MiB",
            ],
            rows,
        ),
    ]
    roles = [
        [
            label,
            g["pid"],
            role,
            r["count"],
            f"{r['first_bytes'] / MIB:.0f}",
            f"{r['last_bytes'] / MIB:.0f}",
            f"{r['growth_bytes'] / MIB:+.0f}",
            f"{r['growth']:+.1%}",
            *_role_reference_cells(g.get("reference") or {}, role),
        ]
        for label, f in procs.items()
        for g in f["rss"]
        for role, r in g.get("by_role", {}).items()
    ]
    if not roles:
        return [*out, "", "The log has no RSS split by process role (samples without by_role)."]
    return [
        *out,
        "",
        f"The same, by process role ({sample.TOP_ROLE}: the server process itself, vLLM's API "
        "front-end; the others its descendants by command name, summed over processes of one "
        "name):",
        "",
        *_table(
            [
                "label",
                "pid",
                "role",
                "processes",
                "first MiB",
                "last MiB",
                "growth MiB",
                "growth",
                "plain vLLM growth MiB",
                "excess MiB",
            ],
            roles,
        ),
    ]


def _reference_cells(ref: dict) -> list[str]:
    if not ref:
        return ["", "", "", ""]
    if "note" in ref:
        return [f"{ref['label']}: {ref['note']}", "", "", ""]
    return [
        ref["label"],
        f"{ref['growth_bytes'] / MIB:+.0f}",
        f"{ref['growth']:+.1%}",
        f"{ref['excess_bytes'] / MIB:+.0f}",
    ]


def _role_reference_cells(ref: dict, role: str) -> list[str]:
    r = (ref.get("by_role") or {}).get(role)
    if r is None:
        return ["", ""]
    return [f"{r['growth_bytes'] / MIB:+.0f}", f"{r['excess_bytes'] / MIB:+.0f}"]


def _leftovers(left: dict) -> list[str]:
    after = left["after_shutdown"] or {}
    last = left["last_sample"]
    judged = ("shm_regions", "temp_files", "servers_alive", "survivors", "survivor_grace_s")
    survivors = [
        f"- alive {after.get('survivor_grace_s', '?')} s after the servers' exit, then killed: "
        f"pid {p['pid']}: `{p['cmdline']}`"
        for p in after.get("survivors") or []
    ]
    others = survivors + [
        f"- {k} (the harness's, not judged): {v}" for k, v in after.items() if k not in judged
    ]
    return [
        *_table(
            ["", "/dev/shm regions", "temp files", "servers alive"],
            [
                ["last sample", last.get("shm_regions"), last.get("temp_files"), ""],
                [
                    "after shutdown",
                    after.get("shm_regions", "?"),
                    after.get("temp_files", "?"),
                    after.get("servers_alive", "?"),
                ],
            ],
        ),
        "",
        *others,
    ]
