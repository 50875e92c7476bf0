"""The restore decision's evidence as a small file, so a fresh process starts measured.

Whatever a disk tier holds was stored by an earlier process of the same engine namespace,
which served those prompts and timed its prefill (and its loads) while doing so. A process
that restarts reads the disk exactly when its own policy knows nothing yet, so the earlier
process's measurements are kept with the data and replayed at start-up
(``RestorePolicy.adopt``). This module is the file's format; the adapter decides where it lives
and when it is written (``kvtier.runtime.decision_memory``).

A file applies only to the engine that wrote it: the same namespace (model, weights, KV
layout, block-hash seed, parallel layout), the same format version and the same device
description (platform and GPU or CPU model, and what else the adapter adds that changes the
timings: on CUDA the tensor-parallel size and how prefill was timed), so a folder moved to
other hardware does not inherit foreign timings. Anything else is *rejected* with a reason
(``EvidenceRejected``), and the caller starts unmeasured: a file can make the decision better
informed, never break it.

Format (JSON, version 1; at most ``DECISION_FILE_MAX_BYTES``, oldest measurements
dropped first to fit)::

    {"format": "kvtier-decision-evidence", "version": 1,
     "namespace": "<digest hex>", "device": "cuda: <GPU name>",
     "saved_at": 1764590000.0,                       # Unix seconds
     "prefill_steps": [{"seconds": 0.21, "segments": [[0, 8192]]}, ...],   # oldest first
     "tier_loads": {"disk": [[nbytes, seconds], ...]}}                     # oldest first

Times are rounded to 6 significant digits (a few microseconds of a millisecond step: well
inside the noise) to keep the file small. Written atomically, private (0600), fsynced:
``kvtier.small_files.write_small_file``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import KvtierError
from kvtier.policy.evidence import PolicyEvidence
from kvtier.policy.prefill import MeasuredStep
from kvtier.policy.restore import MeasuredLoad
from kvtier.small_files import DECISION_FILE_MAX_BYTES, read_small_file, write_small_file

FORMAT = "kvtier-decision-evidence"
VERSION = 1


class EvidenceRejected(KvtierError):
    """An evidence file that must not be used; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class EvidenceFile:
    """One saved record of a policy's evidence and whose it is."""

    #: Digest hex of the engine namespace it was measured for.
    namespace: str
    #: The device it was measured on (``Release.device_description``).
    device: str
    #: Unix seconds of the save.
    saved_at_s: float
    evidence: PolicyEvidence

    @property
    def saved_on(self) -> str:
        """The save's date and time, for a log line (UTC)."""
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.saved_at_s))


def _rounded(seconds: float) -> float:
    return float(f"{seconds:.6g}")


def encode(record: EvidenceFile) -> bytes:
    """The file's bytes, at most ``DECISION_FILE_MAX_BYTES`` (oldest entries dropped to fit)."""
    steps = [
        {"seconds": _rounded(s.seconds), "segments": [[m, n] for m, n in s.segments]}
        for s in record.evidence.prefill_steps
    ]
    loads = {
        tier: [[load.nbytes, _rounded(load.seconds)] for load in measured]
        for tier, measured in record.evidence.tier_loads.items()
    }
    while True:
        data = json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "namespace": record.namespace,
                "device": record.device,
                "saved_at": record.saved_at_s,
                "prefill_steps": steps,
                "tier_loads": loads,
            },
            separators=(",", ":"),
        ).encode()
        if len(data) <= DECISION_FILE_MAX_BYTES:
            return data
        # Drop the oldest of whichever list is longest: both keep their newest entries.
        longest = max([steps, *loads.values()], key=len)
        if not longest:
            raise EvidenceRejected("namespace or device description too long to save")
        del longest[0]


def decode(data: bytes, namespace: str, device: str) -> EvidenceFile:
    """The record in ``data`` if it is one for ``namespace`` on ``device``; else
    ``EvidenceRejected`` naming why (damaged, another format version, namespace or device)."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise EvidenceRejected("damaged: not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise EvidenceRejected("damaged: not a kvtier decision evidence file")
    version = doc.get("version")
    if version != VERSION or isinstance(version, bool):
        raise EvidenceRejected(f"format version {version!r}, this kvtier reads {VERSION}")
    if doc.get("namespace") != namespace:
        raise EvidenceRejected(f"written for namespace {str(doc.get('namespace'))[:12]}")
    if doc.get("device") != device:
        raise EvidenceRejected(
            f"measured on another device or setup ({str(doc.get('device'))[:100]})"
        )
    try:
        saved_at = _number(doc.get("saved_at"), allow_zero=True)
        steps = tuple(_step(entry) for entry in _items(doc.get("prefill_steps")))
        loads_doc = doc.get("tier_loads")
        if not isinstance(loads_doc, dict):
            raise ValueError("tier_loads")
        loads = {
            str(tier): tuple(_load(entry) for entry in _items(measured))
            for tier, measured in loads_doc.items()
        }
    except (TypeError, ValueError) as exc:
        raise EvidenceRejected(f"damaged: bad {exc}") from None
    return EvidenceFile(namespace, device, saved_at, PolicyEvidence(steps, loads))


def _items(value: Any) -> list[Any]:
    # No length limit of its own: the file's size limit bounds every list.
    if not isinstance(value, list):
        raise ValueError("list")
    return value


def _number(value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"number {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"number {value!r}")
    return float(value)


def _count(value: Any, *, positive: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (1 if positive else 0):
        raise ValueError(f"count {value!r}")
    return value


def _step(entry: Any) -> MeasuredStep:
    if not isinstance(entry, dict):
        raise ValueError("prefill step")
    segments = entry.get("segments")
    if not isinstance(segments, list) or not segments:
        raise ValueError("prefill step segments")
    pairs = []
    for pair in segments:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError("prefill step segment")
        pairs.append((_count(pair[0]), _count(pair[1], positive=True)))
    return MeasuredStep(tuple(pairs), _number(entry.get("seconds")))


def _load(entry: Any) -> MeasuredLoad:
    if not isinstance(entry, list) or len(entry) != 2:
        raise ValueError("tier load")
    return MeasuredLoad(_count(entry[0]), _number(entry[1]))


def save(path: Path, record: EvidenceFile) -> None:
    """Replace the file at ``path`` with ``record`` (atomic, 0600, fsynced). Raises
    ``OSError`` when the folder cannot be written (the caller warns and carries on)."""
    write_small_file(path, encode(record))


def load(path: Path, namespace: str, device: str) -> EvidenceFile | None:
    """The record at ``path`` for this namespace and device; None if there is no file;
    ``EvidenceRejected`` when there is one that must not be used (unreadable, damaged, or
    another version, namespace or device)."""
    try:
        data = read_small_file(path, DECISION_FILE_MAX_BYTES)
    except OSError as exc:
        raise EvidenceRejected(f"unreadable: {exc.strerror or exc}") from None
    if data is None:
        return None
    return decode(data, namespace, device)
