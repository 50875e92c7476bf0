"""GPU evidence for the restore-or-recompute policy: measure on a CUDA machine, then report.

Two steps (the first needs torch and a GPU; the second is pure Python and runs anywhere):

    python -m benchmarks gpu-measure --out raw.json [--reps 5]
    python -m benchmarks gpu-evidence raw.json \\
        --json docs/bench/gpu-evidence.json --md docs/bench/gpu-evidence.md

(``gpu-evidence`` also reads a saved report: ``gpu-evidence docs/bench/gpu-evidence.json``
redoes the tables from the raw figures stored in it, on any machine.)

Measuring is ``benchmarks.gpu_measure`` (prefill of real model shapes, pinned
host -> GPU copies, DiskStore cold reads, cuFile reads). This module feeds those figures into
``kvtier.policy`` exactly as an adapter would, and tabulates per model x context x tier: KV
bytes, the policy's predicted restore time, the measured restore time, the measured (and
predicted) recompute time, and what the policy picks.

Kept honest on purpose:

* The policy never sees the figures it is judged against. Restore estimates are fed with
  *other* measurements (one-copy H2D sizes, the store's 2 GiB thread sweep, the cuFile sweep);
  the prefill model is calibrated on short steps only (at most ``CALIBRATION_MAX_TOKENS``
  tokens of context) and must extrapolate to 16k and 32k.
* "Right?" compares the pick with the measured times: ``yes``; ``missed`` (the policy
  recomputed where a restore was measured faster: a lost gain, allowed by the safety factor);
  ``WRONG`` (the policy restored where recompute was measured faster: invariant 9 broken).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from kvtier.bench.report import markdown_table
from kvtier.policy import PolicySettings, PrefillModel, RestorePolicy, RestorePrior

GiB = 1 << 30
MiB = 1 << 20
CONTEXTS = (2048, 8192, 16384, 32768)
#: The record set the whole-hit restores read (gpu_measure writes it).
RESTORE_RECORDS = "256 tokens (32 MiB)"
#: Steps with at most this many tokens of context (cached + new) calibrate the prefill model.
CALIBRATION_MAX_TOKENS = 8192
#: Priors the report's tiers start from (replaced by the fed measurements).
PRIORS = {
    "host": RestorePrior(bandwidth_bytes_per_s=5e9, latency_s=0.001),
    "disk": RestorePrior(bandwidth_bytes_per_s=1e9, latency_s=0.005),
    "gds": RestorePrior(bandwidth_bytes_per_s=1e9, latency_s=0.005),
}
TIER_LABELS = {
    "host": "host pool -> GPU",
    "disk": "local disk -> GPU",
    "gds": "cuFile (compat) -> GPU",
}


def _result(raw: dict[str, Any], name: str) -> dict[str, Any] | None:
    section = raw["sections"].get(name)
    if not section or not section.get("ok"):
        return None
    value = section["result"]
    if name == "gds" and "error" in value:
        return None
    return value


def _median(values: list[float]) -> float:
    return statistics.median(values)


def build_policy(
    raw: dict[str, Any], model: dict[str, Any], settings: PolicySettings | None = None
) -> tuple[RestorePolicy, list[str]]:
    """A policy fed as an adapter would feed it; returns it and the tiers it knows."""
    prefill = PrefillModel()
    calibration = [
        (s["cached"], s["new"], s["model_s"])
        for s in model["steps"]
        if s["cached"] + s["new"] <= CALIBRATION_MAX_TOKENS
    ]
    prefill.calibrate(calibration)
    policy = RestorePolicy(settings or PolicySettings(), prefill)
    tiers = []
    h2d = _result(raw, "h2d")
    if h2d is not None:
        policy.add_tier("host", PRIORS["host"])
        for sample in h2d["sizes"]:
            for seconds in sample["times_s"]:
                policy.observe_load("host", sample["bytes"], seconds)
        tiers.append("host")
    disk = _result(raw, "disk")
    if disk is not None:
        # Disk hits land in the host pool, then take the host pool's copy to the GPU.
        policy.add_tier("disk", PRIORS["disk"], via="host" if "host" in tiers else None)
        # The loads a deployment's disk tier sees: the record size of the restores (one
        # deployment has one block size), read with the thread count that did best.
        entry = disk["record_sets"][RESTORE_RECORDS]
        best = max(entry["threads"].values(), key=lambda t: t["GBps"])
        for seconds in best["times_s"]:
            policy.observe_load("disk", entry["sweep_bytes"], seconds)
        tiers.append("disk")
    gds = _result(raw, "gds")
    if gds is not None:
        policy.add_tier("gds", PRIORS["gds"])
        best = max(gds["threads"].values(), key=lambda t: t["GBps"])
        for seconds in best["times_s"]:
            policy.observe_load("gds", gds["sweep_bytes"], seconds)
        tiers.append("gds")
    return policy, tiers


def measured_restore_s(raw: dict[str, Any], tier: str, nbytes: int) -> float | None:
    if tier in ("host", "disk"):
        disk = _result(raw, "disk")
        rows = [r for r in (disk or {}).get("restores", []) if r["bytes"] == nbytes]
        if not rows or "skipped" in rows[0]:
            return None
        h2d = _median(rows[0]["h2d_s"])
        return h2d if tier == "host" else _median(rows[0]["read_s"]) + h2d
    gds = _result(raw, "gds")
    rows = [r for r in (gds or {}).get("restores", []) if r["bytes"] == nbytes]
    if not rows or "skipped" in rows[0]:
        return None
    return _median(rows[0]["times_s"])


def verdict(restore: bool, measured_restore: float | None, measured_recompute: float) -> str:
    if measured_restore is None:
        return "n/a"
    faster = measured_restore < measured_recompute
    if restore == faster:
        return "yes"
    return "WRONG" if restore else "missed"


def derive(raw: dict[str, Any], settings: PolicySettings | None = None) -> dict[str, Any]:
    """Every table the report prints, as data (also saved in the JSON); ``settings``: the
    policy's (default: the engine's)."""
    prefill = _result(raw, "prefill")
    if prefill is None:
        raise SystemExit("report: the raw results have no prefill section; run measure again")
    rows: list[dict[str, Any]] = []
    fits: dict[str, Any] = {}
    for name, model in prefill["models"].items():
        if "steps" not in model:
            continue
        policy, tiers = build_policy(raw, model, settings)
        tier_fits = {
            t: {"bandwidth_bytes_per_s": v.bandwidth_bytes_per_s, "latency_s": v.latency_s}
            for t, v in policy.snapshot().tiers.items()
        }
        coef = policy.prefill.coefficients()
        steps = {(s["cached"], s["new"]): s["model_s"] for s in model["steps"]}
        online = PrefillModel()
        for (m, n), t in steps.items():
            online.observe_step([(m, n)], t)
        fits[name] = {
            "tier_estimates": tier_fits,
            "online_all_steps_max_error": max(
                abs(online.step_seconds([k]) / t - 1) for k, t in steps.items()
            ),
            "coefficients": {
                "step_s": coef.step_s,
                "per_token_s": coef.per_token_s,
                "per_pair_s": coef.per_pair_s,
            },
            "calibrated_on": [list(k) for k in steps if sum(k) <= CALIBRATION_MAX_TOKENS],
            "steps": [
                {
                    "cached": m,
                    "new": n,
                    "measured_s": t,
                    "predicted_s": policy.prefill.step_seconds([(m, n)]),
                }
                for (m, n), t in steps.items()
            ],
        }
        per_token = model["kv_bytes_per_token"]
        for ctx in CONTEXTS:
            for cached in (0, ctx // 2):
                new = ctx - cached
                measured_recompute = steps.get((cached, new))
                if measured_recompute is None:
                    continue
                nbytes = per_token * new
                for tier in tiers:
                    decision = policy.decide(tier, cached, new, nbytes)
                    restore = decision.restore
                    predicted = decision.restore_s
                    measured = measured_restore_s(raw, tier, nbytes)
                    # A restored request still runs one step for its last token(s): charge
                    # the fitted step cost to the measured restore, as the measured
                    # recompute (one whole step) includes it.
                    step_s = policy.prefill.coefficients().step_s
                    rows.append(
                        {
                            "model": name,
                            "context": ctx,
                            "cached": cached,
                            "hit_tokens": new,
                            "tier": tier,
                            "kv_bytes": nbytes,
                            "predicted_restore_s": predicted,
                            "measured_restore_s": measured,
                            "predicted_recompute_s": decision.recompute_s + step_s,
                            "measured_recompute_s": measured_recompute,
                            "step_s": step_s,
                            "pick": "restore" if restore else "recompute",
                            "right": verdict(
                                restore,
                                None if measured is None else measured + step_s,
                                measured_recompute,
                            ),
                        }
                    )
    used = settings or PolicySettings()
    return {
        "rows": rows,
        "prefill_fits": fits,
        "safety_factor": used.safety_factor,
        "safety_factor_within_evidence": min(
            used.safety_factor_within_evidence, used.safety_factor
        ),
    }


#: The bound the decision is held to: TTFT at most this times the better of restore and
#: recompute.
WITHIN = 1.05


def factor_sweep(raw: dict[str, Any], factors: list[float]) -> str:
    """The same picks under fixed safety factors (the same inside and beyond the evidence),
    then under the engine's own rule: per rule, how many cells end over ``WITHIN`` x the
    better of the two measured paths (a restore picked that was slower, or a recompute picked
    where the restore was faster), and the worst such cell. The restored path is charged the
    fitted step cost, as in the decision table."""
    engine = PolicySettings()
    rules = [
        (f"{f:g}", PolicySettings(safety_factor=f, safety_factor_within_evidence=f))
        for f in factors
    ]
    rules.append(
        (
            f"{engine.safety_factor:g}, {engine.safety_factor_within_evidence:g} within the "
            "evidence (the engine's)",
            engine,
        )
    )
    table = []
    for label, settings in rules:
        rows = derive(raw, settings)["rows"]
        judged = [r for r in rows if r["measured_restore_s"] is not None]
        over = []
        for r in judged:
            restored = r["measured_restore_s"] + r["step_s"]
            taken = restored if r["pick"] == "restore" else r["measured_recompute_s"]
            ratio = taken / min(restored, r["measured_recompute_s"])
            if ratio > WITHIN:
                over.append((ratio, r))
        wrong = sum(1 for _, r in over if r["pick"] == "restore")
        worst = max(over, key=lambda item: item[0], default=None)
        table.append(
            [
                label,
                str(len(judged)),
                str(len(over) - wrong),
                str(wrong),
                "–"
                if worst is None
                else f"{worst[0]:.2f} ({worst[1]['model']}, {worst[1]['context']}, cached "
                f"{worst[1]['cached']}, {TIER_LABELS[worst[1]['tier']]}, {worst[1]['pick']})",
            ]
        )
    headers = [
        "safety factor",
        "cells",
        f"recomputed, restore faster by > {WITHIN:g}x",
        f"restored, slower by > {WITHIN:g}x",
        "worst cell (x the better path)",
    ]
    return markdown_table(headers, table) + "\n"


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_bytes(nbytes: int) -> str:
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.0f} MiB"


def render(raw: dict[str, Any], derived: dict[str, Any]) -> str:
    """The markdown tables (decision table first, then the figures behind it)."""
    out = []
    env = _result(raw, "env") or {}
    smi = (env.get("nvidia_smi") or "").splitlines()
    mount = (env.get("mounts_for_dir") or "").splitlines()
    out.append(
        f"Machine: {env.get('gpu')} (nvidia-smi: {smi[-1] if smi else '?'}), "
        f"{env.get('cpus')} CPUs, kernel {env.get('kernel')}, torch {env.get('torch')} "
        f"(CUDA {env.get('cuda')}); store folder on `{mount[-1] if mount else '?'}`; "
        f"page cache dropped before every cold read: {env.get('drop_caches_allowed')}; "
        f"nvidia-fs loaded: {env.get('nvidia_fs_module')}."
    )
    out.append("")
    out.append(
        f"### Restore or recompute (safety factor {derived['safety_factor']}, "
        f"{derived.get('safety_factor_within_evidence', derived['safety_factor'])} within the "
        "evidence; "
        "hit = the last `hit` tokens of the context, after `cached` tokens)"
    )
    out.append("")
    table = []
    for r in derived["rows"]:
        table.append(
            [
                r["model"],
                r["context"],
                r["cached"],
                TIER_LABELS[r["tier"]],
                _fmt_bytes(r["kv_bytes"]),
                _fmt_s(r["predicted_restore_s"]),
                _fmt_s(r["measured_restore_s"]),
                _fmt_s(r["predicted_recompute_s"]),
                _fmt_s(r["measured_recompute_s"]),
                r["pick"],
                r["right"],
            ]
        )
    out.append(
        markdown_table(
            [
                "model",
                "context",
                "cached",
                "tier",
                "KV bytes",
                "restore (pred.)",
                "restore (meas.)",
                "recompute (pred.)",
                "recompute (meas.)",
                "policy",
                "right?",
            ],
            table,
        )
    )
    counts = {k: sum(r["right"] == k for r in derived["rows"]) for k in ("yes", "missed", "WRONG")}
    out.append("")
    out.append(
        f"Picks: {counts['yes']} right, {counts['missed']} missed gains, "
        f"{counts['WRONG']} wrong (restored although slower)."
    )
    out.append("")
    out.append(
        "### Break-even restore bandwidth (KV bytes / measured recompute time: a tier must "
        "sustain more than this, latency aside, to beat recompute)"
    )
    out.append("")
    even_rows = []
    for name, model in (_result(raw, "prefill") or {"models": {}})["models"].items():
        steps = {(s["cached"], s["new"]): s["model_s"] for s in model.get("steps", [])}
        cells = []
        for ctx in CONTEXTS:
            t = steps.get((0, ctx))
            cells.append("–" if t is None else f"{model['kv_bytes_per_token'] * ctx / t / 1e9:.1f}")
        even_rows.append([name, *cells])
    out.append(markdown_table(["model", *(f"{c} tokens, GB/s" for c in CONTEXTS)], even_rows))
    out.append("")
    out.append(
        "### Prefill fit (calibrated on steps of <= "
        f"{CALIBRATION_MAX_TOKENS} tokens of context, then extrapolated)"
    )
    out.append("")
    fit_rows = []
    for name, fit in derived["prefill_fits"].items():
        c = fit["coefficients"]
        errors = [abs(s["predicted_s"] / s["measured_s"] - 1) for s in fit["steps"]]
        held_out = [
            abs(s["predicted_s"] / s["measured_s"] - 1)
            for s in fit["steps"]
            if s["cached"] + s["new"] > CALIBRATION_MAX_TOKENS
        ]
        fit_rows.append(
            [
                name,
                f"{c['step_s'] * 1e3:.2f} ms",
                f"{c['per_token_s'] * 1e6:.2f} us",
                f"{c['per_pair_s'] * 1e12:.3f} ps",
                f"{max(errors) * 100:.0f}%",
                f"{max(held_out) * 100:.0f}%" if held_out else "–",
                f"{fit['online_all_steps_max_error'] * 100:.0f}%",
            ]
        )
    out.append(
        markdown_table(
            [
                "model",
                "a (per step)",
                "b (per token)",
                "c (per pair)",
                "max error, all steps",
                "max error, held-out steps",
                "max error, online fit of all steps",
            ],
            fit_rows,
        )
    )
    out.append("")
    out.append("### Measured prefill (bf16, layers timed and scaled to the whole model)")
    out.append("")
    prefill = _result(raw, "prefill") or {"models": {}}
    step_rows = []
    for name, model in prefill["models"].items():
        for s in model.get("steps", []):
            step_rows.append(
                [
                    name,
                    s["cached"],
                    s["new"],
                    f"{s['per_layer_median_s'] * 1e3:.2f} ms",
                    model["shape"]["layers"],
                    _fmt_s(s["model_s"]),
                    f"{s['new'] / s['model_s']:.0f}",
                ]
            )
    out.append(
        markdown_table(
            ["model", "cached m", "new n", "per layer (median)", "layers", "model", "tokens/s"],
            step_rows,
        )
    )
    out.append("")
    out.append("### Bandwidths (GB/s = 10^9 B/s; medians)")
    out.append("")
    bw_rows = []
    h2d = _result(raw, "h2d")
    if h2d:
        for case, v in h2d["cases"].items():
            bw_rows.append(
                [
                    "pinned host -> GPU" if "pageable" not in case else "host -> GPU",
                    case,
                    _fmt_bytes(h2d["bytes"] if "pageable" not in case else GiB),
                    f"{v['GBps']:.1f}",
                ]
            )
    disk = _result(raw, "disk")
    if disk:
        for label, entry in disk["record_sets"].items():
            for threads, v in entry["threads"].items():
                bw_rows.append(
                    [
                        f"DiskStore.get_into, cold, {label}",
                        f"{threads} threads",
                        _fmt_bytes(entry["sweep_bytes"]),
                        f"{v['GBps']:.2f}",
                    ]
                )
            for case in ("plain sequential, buffered", "plain sequential, O_DIRECT"):
                rate = f"{entry[case]['GBps']:.2f}"
                bw_rows.append(
                    [
                        f"{case}, cold, same files",
                        "1 thread",
                        _fmt_bytes(entry["sweep_bytes"]),
                        rate,
                    ]
                )
            bw_rows.append(
                [
                    f"DiskStore.put, {label}",
                    "1 thread",
                    _fmt_bytes(entry["record_bytes"] * entry["records"]),
                    f"{entry['put_GBps']:.2f}",
                ]
            )
    gds = _result(raw, "gds")
    if gds:
        for threads, v in gds["threads"].items():
            bw_rows.append(
                [
                    "cuFile read -> GPU, cold, 32 MiB records",
                    f"{threads} threads",
                    _fmt_bytes(gds["sweep_bytes"]),
                    f"{v['GBps']:.2f}",
                ]
            )
    out.append(markdown_table(["path", "how", "bytes", "GB/s"], bw_rows))
    return "\n".join(out) + "\n"


def report(
    raw_path: Path,
    json_path: Path | None,
    md_path: Path | None,
    factors: list[float] | None = None,
) -> str:
    """The tables of a raw (or saved) result; also written to ``json_path`` / ``md_path``.
    ``factors``: only the sweep of safety factors (``factor_sweep``), nothing written."""
    raw = json.loads(raw_path.read_text())
    raw = raw.get("raw", raw)  # a saved report (docs/bench/gpu-evidence.json) holds its raw
    if factors:
        return factor_sweep(raw, factors)
    derived = derive(raw)
    text = render(raw, derived)
    if json_path:
        document = {
            "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
            "raw": raw,
            "derived": derived,
        }
        json_path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    if md_path:
        md_path.write_text(text)
    return text
