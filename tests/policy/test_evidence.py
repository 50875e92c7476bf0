"""The GPU evidence report: it feeds measurements to kvtier.policy and grades the picks honestly.

Runs on synthetic raw results (no GPU): the report must label a restore that measured slower
than recompute WRONG, a missed gain as missed, and agree where the estimates were right.
"""

import json

import pytest

from benchmarks import gpu_evidence
from kvtier.policy import PrefillCoefficients

MIB = 1 << 20
GIB = 1 << 30
PER_TOKEN = 128 << 10
ENGINE = PrefillCoefficients(step_s=0.004, per_token_s=4e-5, per_pair_s=1e-10)
SWEEP = 2 * GIB
STEPS = [(0, 512), (0, 2048), (0, 4096), (0, 8192), (4096, 4096), (6144, 2048), (0, 16384)]
STEPS += [(8192, 8192), (0, 32768), (16384, 16384), (1024, 1024)]


def raw_results(disk_sweep_gbps: float, disk_restore_gbps: float) -> dict:
    """Minimal raw results: one model, fast H2D, a disk whose sweep and restores may differ."""
    steps = []
    for m, n in STEPS:
        t = ENGINE.step_seconds([(m, n)])
        steps.append({"cached": m, "new": n, "model_s": t, "per_layer_median_s": t / 32})
    sizes = sorted({PER_TOKEN * c // d for c in gpu_evidence.CONTEXTS for d in (1, 2)})
    sweep_s = SWEEP / (disk_sweep_gbps * 1e9)
    return {
        "sections": {
            "env": {"ok": True, "result": {"gpu": "fake"}},
            "prefill": {
                "ok": True,
                "result": {
                    "models": {
                        "m": {
                            "shape": {"layers": 32},
                            "kv_bytes_per_token": PER_TOKEN,
                            "steps": steps,
                        }
                    }
                },
            },
            "h2d": {
                "ok": True,
                "result": {
                    "bytes": GIB,
                    "cases": {},
                    "sizes": [{"bytes": b, "times_s": [b / 50e9]} for b in (MIB, 64 * MIB, GIB)],
                },
            },
            "disk": {
                "ok": True,
                "result": {
                    "record_sets": {
                        gpu_evidence.RESTORE_RECORDS: {
                            "record_bytes": 32 * MIB,
                            "records": 320,
                            "put_GBps": 1.0,
                            "sweep_bytes": SWEEP,
                            "threads": {"8": {"times_s": [sweep_s, sweep_s], "GBps": 1.0}},
                            "plain sequential, buffered": {"GBps": 1.0},
                            "plain sequential, O_DIRECT": {"GBps": 1.0},
                        }
                    },
                    "restores": [
                        {
                            "bytes": b,
                            "read_s": [b / (disk_restore_gbps * 1e9)],
                            "h2d_s": [b / 50e9],
                        }
                        for b in sizes
                    ],
                },
            },
        }
    }


def rows_for(raw: dict, tier: str) -> list[dict]:
    return [r for r in gpu_evidence.derive(raw)["rows"] if r["tier"] == tier]


def test_estimates_that_match_the_restores_give_right_picks():
    rows = rows_for(raw_results(disk_sweep_gbps=2.0, disk_restore_gbps=2.0), "disk")
    assert rows
    assert {r["right"] for r in rows} <= {"yes", "missed"}
    assert all(r["right"] == "yes" for r in rows_for(raw_results(2.0, 2.0), "host"))


def test_a_restore_slower_than_its_estimate_is_graded_wrong():
    # The sweep promised 20 GB/s, the restores ran at 0.5: every restore pick is wrong.
    rows = rows_for(raw_results(disk_sweep_gbps=20.0, disk_restore_gbps=0.5), "disk")
    assert any(r["pick"] == "restore" for r in rows)
    assert all(r["right"] == "WRONG" for r in rows if r["pick"] == "restore")


def test_a_gain_refused_by_a_pessimistic_estimate_is_graded_missed():
    rows = rows_for(raw_results(disk_sweep_gbps=0.5, disk_restore_gbps=20.0), "disk")
    assert all(r["pick"] == "recompute" for r in rows)
    assert any(r["right"] == "missed" for r in rows)


def test_the_report_rereads_its_own_json(tmp_path):
    from typer.testing import CliRunner

    from benchmarks.cli import app

    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(raw_results(2.0, 2.0)))
    saved = tmp_path / "report.json"
    runner = CliRunner()
    first = runner.invoke(app, ["gpu-evidence", str(raw), "--json", str(saved)])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["gpu-evidence", str(saved)])
    assert again.exit_code == 0, again.output
    assert again.stdout == first.stdout
    assert "| m | 2048 | 0 | host pool -> GPU |" in first.stdout


def test_a_report_without_prefill_figures_says_so():
    raw = raw_results(2.0, 2.0)
    raw["sections"]["prefill"] = {"ok": False, "error": "boom"}
    with pytest.raises(SystemExit, match="no prefill section"):
        gpu_evidence.derive(raw)


#: The sweep's last row: the engine's own rule.
ENGINE_RULE = "1.2, 1.05 within the evidence (the engine's)"


def sweep_counts(raw: dict, factors: list[float]) -> dict[float | str, tuple[int, int]]:
    """Per fixed factor, and for ``ENGINE_RULE``: (recomputed where the restore was faster,
    restored where it was slower), each by more than the bound, read from the sweep's table."""
    lines = gpu_evidence.factor_sweep(raw, factors).splitlines()[2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert cells[-1][0] == ENGINE_RULE
    counts: dict[float | str, tuple[int, int]] = {
        float(c[0]): (int(c[2]), int(c[3])) for c in cells[:-1]
    }
    counts[ENGINE_RULE] = (int(cells[-1][2]), int(cells[-1][3]))
    return counts


def test_the_factor_sweep_counts_what_each_factor_gets_wrong():
    right = raw_results(disk_sweep_gbps=2.0, disk_restore_gbps=2.0)
    counts = sweep_counts(right, [1.0, 100.0])
    assert counts[1.0] == (0, 0), "exact estimates, no margin: every pick within the bound"
    assert counts[ENGINE_RULE] == (0, 0), "exact estimates, the engine's margins: the same"
    assert counts[100.0][0] > 0 and counts[100.0][1] == 0, "a huge margin refuses real gains"
    optimistic = raw_results(disk_sweep_gbps=20.0, disk_restore_gbps=0.5)
    assert sweep_counts(optimistic, [1.0])[1.0][1] > 0, "slow restores taken on a promise"


def test_the_factor_sweep_from_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from benchmarks.cli import app

    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(raw_results(2.0, 2.0)))
    result = CliRunner().invoke(app, ["gpu-evidence", str(raw), "--safety-factors", "1,1.2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("| safety factor | cells |")
    labels = [line.split("|")[1].strip() for line in result.stdout.splitlines()[2:]]
    assert labels == ["1", "1.2", ENGINE_RULE]
