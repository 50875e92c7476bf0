"""kvtier's log output inside vLLM processes.

vLLM configures only its own ``vllm`` logger, so records of ``kvtier.*`` loggers would vanish in
an engine process. ``setup_logging`` gives the ``kvtier`` logger a handler in vLLM's format once.
The spec and the tiers call it from their constructors, not at import, so a bad
``KVTIER_LOG_LEVEL`` refuses start-up with its fix named (``kvtier.env``).
"""

import logging
import sys

from kvtier.env import read_env

_FORMAT = "(%(processName)s pid=%(process)d) %(levelname)s %(asctime)s [kvtier] %(message)s"


def setup_logging() -> None:
    """Attach one stdout handler to the ``kvtier`` logger (idempotent); ``ConfigError`` if
    ``KVTIER_*`` variables are invalid (checked on every call: it is where the engine starts)."""
    level = read_env().log_level
    root = logging.getLogger("kvtier")
    if any(getattr(h, "_kvtier", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%m-%d %H:%M:%S"))
    handler._kvtier = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
