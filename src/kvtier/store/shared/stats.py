"""The shared tier's counters: ``StoreStats`` plus server-fault and breaker figures."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvtier.store.base import StoreStats


@dataclass(slots=True)
class SharedStoreStats(StoreStats):
    """``StoreStats`` plus the shared tier's own counters (this process only).

    ``corrupt`` counts values that failed verification, by reason; ``put_failures`` every put
    that stored nothing (refused, server full, server unreachable). ``evictions`` stays 0: the
    server evicts, and does not tell.
    """

    #: Operations refused without I/O because the server's breaker was open.
    breaker_skips: int = 0
    #: Times a server's breaker opened (a server became unreachable or hung).
    breaker_openings: int = 0
    #: Times a server answered again after its breaker had opened.
    reconnects: int = 0
    #: Corrupt values deleted on the server.
    corrupt_deleted: int = 0
    #: Hits received from the socket straight into ``out`` or the bounce buffer (the rest of
    #: ``hits`` went through a bytes object of redis-py's: no hiredis, no usable bounce).
    direct_hits: int = 0
    #: Hits received in an exchange of a thread's share (kvtier.store.shared.batch): one
    #: GIL-free call for the share, where a GET per record gives the GIL up about four times.
    batched_hits: int = 0
    #: Failed operations by kind: "connection", "timeout", "oom", "permission", "response",
    #: "too_large" (put refused before any I/O), "unexpected".
    errors: dict[str, int] = field(default_factory=dict)

    def copy(self) -> SharedStoreStats:
        return dataclasses.replace(self, corrupt=dict(self.corrupt), errors=dict(self.errors))
