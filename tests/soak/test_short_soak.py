"""The CI soak: ``python -m benchmarks soak --short`` passes its own verdict with faults of
several kinds injected and nothing left behind."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kvtier.bench.redis_servers import server_binary

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

CHECKOUT = Path(__file__).resolve().parents[2]


def test_short_soak_passes_with_faults_of_several_kinds(tmp_path: Path) -> None:
    if server_binary() is None:
        pytest.skip("no redis-server or valkey-server on PATH (scripts/redis-server.sh)")
    out = tmp_path / "soak"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(CHECKOUT / "src"), str(CHECKOUT), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # 70 s: the seed's schedule still holds every kind the short run can inject (42 faults of
    # 10 kinds; 61 in 100 s), and the servers still give the leak checks the ten samples after
    # warm-up that they judge (asserted below).
    argv = ["soak", "--short", "--duration", "70", "--no-smollm", "--seed", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *argv, "--out", str(out)],
        cwd=CHECKOUT,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    report = (out / "report.md").read_text() if (out / "report.md").exists() else ""
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{report}"
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert events[0]["type"] == "run" and events[-1]["type"] == "end"
    kinds = Counter(e["kind"] for e in events if e["type"] == "fault")
    assert len(kinds) >= 5, kinds
    outcomes = Counter(e["outcome"] for e in events if e["type"] == "request")
    # The load is paced, but each request waits for its answer: beside another engine test on
    # two cores a 100 s run has served 54 requests, alone 102. 20 answered still means the
    # load ran through the faults.
    assert outcomes["ok"] >= 20 and outcomes["wrong"] == 0, outcomes
    # Each server's RSS is split by process: vLLM's front-end and its engine core, by name.
    roles: dict[str, set[str]] = {}
    for e in (e for e in events if e["type"] == "sample"):
        for label, proc in e["processes"].items():
            roles.setdefault(label, set()).update(proc.get("by_role", {}))
    servers = [s["label"] for s in events[0]["servers"]]
    assert all({"top", "VLLM::EngineCor"} <= roles[label] for label in servers), roles
    checks = {
        row["check"]: row["status"]
        for row in json.loads((out / "report.json").read_text())["acceptance"]
    }
    assert checks["descriptor leak"] == checks["thread leak"] == "pass", checks
    after = events[-1]["after_shutdown"]
    assert after["servers_alive"] == 0 and not after["mounts_left"], after
