"""Wire format between ``EngineProcess`` and its child: one JSON object per line.

Requests go to the child's stdin; replies come back on a dedicated pipe (the child's stdout and
stderr belong to vLLM's logging and are captured to a log file).
"""

import json
from typing import Any


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    return json.loads(line)
