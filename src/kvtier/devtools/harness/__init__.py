"""Drive real vLLM engines in child processes (tests, demo, benchmarks, probes).

An engine lives in its own process so that a test can restart it, kill it, or run two at once,
and so that one engine can serve many tests. ``EngineProcess`` is the parent-side handle;
``kvtier.devtools.harness.child`` is the program the child runs.
"""

from kvtier.devtools.harness.client import EngineConfig, EngineError, EngineProcess, GenerateResult

__all__ = ["EngineConfig", "EngineError", "EngineProcess", "GenerateResult"]
