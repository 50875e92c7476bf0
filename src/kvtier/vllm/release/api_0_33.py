"""API 0.33 (vllm 0.33.0 and 0.34.0, CUDA): API 0.32's tiers under a scheduler that ends a
step differently.

What a tier, the request context, the factory and the spec meet is API 0.32's. The scheduler
calls the manager's ``on_schedule_end`` last in a step, after the step's ``prepare_store``
(up to 0.32 it came first), and holds the manager's ``lock`` while it does; kvtier's step
timing takes that order from ``schedule_end_last``. 0.34.0's additions need nothing of kvtier:
``JobResult.deferred_release`` defaults to None, ``touch`` is gone from tiers and managers
(kvtier's tiers never relied on it being called), and the request context's new properties
are read by vLLM's own policies only. There is no CPU build of this generation.
"""

from __future__ import annotations

from kvtier.vllm.release.api_0_32 import Api032


class Api033(Api032):
    api = "0.33"
    schedule_end_last = True
