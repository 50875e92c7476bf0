"""When each store job's blocks were computed, against when the job reached kvtier's tier.

Reads the log of a diagnostic run (the runner with DEBUG lines at the scheduler's and the
worker's calls: ``docs/bench/gpu-h100-cuda-e2e-70b20l-store-timing-diag-2026-12-05.patch``
applied over the bundle's kvtier) and prints, per store job of a prompt, seconds after the
request's lookup: the end of its compute by a CUDA event on the worker, by the scheduler's
steps (``kvtier.runtime.step_clock``: step s + 2 scheduled, two steps in flight), and the job's
arrival at the tier, which is what the decision's evidence ended at before.

    python benchmarks/gpu/store_timing.py \
        docs/bench/gpu-h100-cuda-e2e-70b20l-store-timing-diag-2026-12-05.log
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict, deque

DEPTH = 2  # asynchronous scheduling: vLLM's max_concurrent_batches


def main(path: str) -> None:
    step_times: list[float] = [0.0]  # step_times[i]: when step i was scheduled
    scheduled_in: dict[str, deque[int]] = defaultdict(deque)
    lookups: dict[str, float] = {}
    # CUDA-event ends of the stores, in order (in this log every one reached the tier).
    computed: deque[float] = deque()
    print("request           tokens  computed  by steps  arrived   (s after the lookup)")
    with open(path, encoding="utf-8") as log:
        lines = log.read().splitlines()
    for line in lines:
        if m := re.search(r"diag mgr on_schedule_end .* t=([\d.]+)", line):
            step_times.append(float(m[1]))
        elif m := re.search(r"diag mgr prepare_store req=(\S+) n=\d+ t=", line):
            scheduled_in[m[1]].append(len(step_times) - 1)
        elif m := re.search(r"diag lookup req=(\S+) t=([\d.]+)", line):
            lookups[m[1]] = float(m[2])
        elif m := re.search(r"diag worker job=\d+ compute_done t=([\d.]+)", line):
            computed.append(float(m[1]))
        elif m := re.search(r"diag store req=(\S+) keys=\d+ end=(\d+) t=([\d.]+)", line):
            req, end, arrived = m[1], int(m[2]), float(m[3])
            step = scheduled_in[req].popleft() + DEPTH
            by_steps = step_times[step] if step < len(step_times) else float("nan")
            lookup = lookups[req]
            done = computed.popleft() if computed else float("nan")
            print(
                f"{req:16s} {end:7d} {done - lookup:9.3f} {by_steps - lookup:9.3f} "
                f"{arrived - lookup:8.3f}"
            )


if __name__ == "__main__":
    main(sys.argv[1])
