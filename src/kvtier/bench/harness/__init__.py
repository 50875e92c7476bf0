"""Drive real vLLM engines (tests, demo, benchmarks, probes) through one interface, ``Engine``.

Drivers: ``ProcessEngine`` (a child process), ``InProcessEngine`` (this process) and
``ServerEngine`` (``kvtier serve`` over HTTP); see ``kvtier.bench.harness.engine``. Only the
interface and the process driver are imported here; the others import vLLM or the server's
plumbing and are imported from their modules.
"""

from kvtier.bench.harness.engine import (
    Engine,
    EngineBase,
    EngineConfig,
    EngineError,
    GenerateResult,
    open_engine,
)
from kvtier.bench.harness.process import ProcessEngine

__all__ = [
    "Engine",
    "EngineBase",
    "EngineConfig",
    "EngineError",
    "GenerateResult",
    "ProcessEngine",
    "open_engine",
]
