"""kvtier's log output inside vLLM processes.

vLLM configures only its own ``vllm`` logger, so records of ``kvtier.*`` loggers would vanish in
an engine process. ``setup_logging`` gives the ``kvtier`` logger a handler in vLLM's format once.
"""

import logging
import os
import sys

_FORMAT = "(%(processName)s pid=%(process)d) %(levelname)s %(asctime)s [kvtier] %(message)s"


def setup_logging() -> None:
    """Attach one stdout handler to the ``kvtier`` logger (idempotent)."""
    root = logging.getLogger("kvtier")
    if any(getattr(h, "_kvtier", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
    handler._kvtier = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(os.environ.get("KVTIER_LOG_LEVEL", "INFO").upper())
    root.propagate = False
