"""The index's queries on a serving store's paths find rows through an index made for them.

Regression: SQLite's planner, knowing nothing of the data, answered ``ns = ? AND key = ?
AND state = 1`` by walking ``records_lru (state, access_ns)`` over every ready record of
every namespace. Each commit (every put), each delete and each batch of access times then
cost time in proportion to the records on the disk: 19 ms per lookup at 131,072 records
instead of 7 us. A plan cannot be timed in a unit test, but it can be read: every statement
the store runs while serving is explained here, and none may scan ``records`` or walk the LRU
index, except the eviction scan, which reads records in LRU order by design.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from kvtier.store import DiskStore
from kvtier.store.disk import layout
from tests.support.store import aligned_buffer, key_of, payload_of

OpenDisk = Callable[..., DiskStore]


def _plans(conn: sqlite3.Connection, statements: list[str]) -> dict[str, list[str]]:
    """Each distinct statement on ``records`` (values inlined by the trace) and its plan."""
    plans: dict[str, list[str]] = {}
    for sql in statements:
        if "records" not in sql or sql.startswith(("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA")):
            continue
        plans[sql] = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
    return plans


def _walks_ready_records(sql: str, plan: list[str]) -> bool:
    """True when ``plan`` reads every record, or every ready one through the LRU index."""
    if "ORDER BY access_ns" in sql:
        return False  # the eviction scan: LRU order is what it wants
    if "state = 0" in sql:
        return False  # pending rows through the LRU index: at most one per put in flight
    return any(step.startswith("SCAN records") or "records_lru" in step for step in plan)


def test_serving_statements_never_walk_every_record(open_disk: OpenDisk, root: Path) -> None:
    store = open_disk(records=6, low_watermark=1.0)
    statements: list[str] = []
    # The store's own connection: only it shows what the store asks SQLite.
    store._index._conn.set_trace_callback(statements.append)
    for i in range(8):  # two past the cap: the reservations evict
        assert store.put(key_of(i), payload_of(i))
    assert store.put(key_of(7), payload_of(8))  # replaces: the commit supersedes
    out = aligned_buffer(len(payload_of(0)))
    assert store.get_into(key_of(7), out)
    assert store.delete(key_of(6))
    store.refresh()
    store.close()  # writes the pending access time
    # Plans depend on the schema (and on statistics, which kvtier never gathers).
    with sqlite3.connect(root / layout.INDEX_FILE) as conn:
        # The queries' results leave through this function (index._query_json).
        conn.create_function("kvtier_result", 1, lambda value: None)
        plans = _plans(conn, statements)
    assert any("UPDATE records SET access_ns" in sql for sql in plans), "no access-time write"
    assert any("key =" in sql for sql in plans), "no lookup by key"
    walking = {sql: plan for sql, plan in plans.items() if _walks_ready_records(sql, plan)}
    assert walking == {}
