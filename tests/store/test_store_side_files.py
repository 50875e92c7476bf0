"""The engines' decision file beside a namespace's records: charged, checked, never a record.

The store neither writes nor interprets ``decision.json`` (kvtier.policy.evidence_file does),
but it sits under the cap, so the cap counts it, ``verify`` makes sure an engine can read it,
and the operator views list the namespace's records as if it were not there.
"""

from __future__ import annotations

import os
import time

from kvtier.store.disk import layout
from kvtier.store.disk.inspect import namespace_summaries, root_usage
from kvtier.store.disk.root import index_files_bytes, namespace_folders
from tests.support.store import key_of

PAYLOAD = bytes(8192)
DECISION = b'{"format": "kvtier-decision-evidence", "version": 1}'


def test_a_decision_file_counts_against_the_cap_as_du_shows(open_disk, root):
    store = open_disk()
    assert store.put(key_of(1), PAYLOAD)
    without = store.footprint_bytes()
    usage_without = root_usage(root).footprint_bytes
    files_without = index_files_bytes(root, 1)
    layout.write_small_file(store.namespace_dir / layout.DECISION_FILE, b"x" * 5000)
    assert store.footprint_bytes() - without == 8192, "5,000 bytes take two 4 KiB units"
    assert root_usage(root).footprint_bytes - usage_without == 8192
    assert index_files_bytes(root, 1) - files_without == 8192


def test_a_decision_file_is_not_a_record_to_ls_or_verify(open_disk, root):
    store = open_disk()
    assert store.put(key_of(1), PAYLOAD)
    layout.write_small_file(store.namespace_dir / layout.DECISION_FILE, DECISION)
    (summary,) = namespace_summaries(root)
    assert summary.blocks == 1
    assert namespace_folders(root) == [store.namespace.digest_hex()]
    assert store.verify() == []
    assert store.verify(fix=True) == [] and (store.namespace_dir / layout.DECISION_FILE).exists()


def test_verify_reports_an_unusable_decision_file_and_fix_removes_it(open_disk):
    store = open_disk()
    path = store.namespace_dir / layout.DECISION_FILE
    for make in (
        lambda: path.write_bytes(b"{torn"),
        lambda: path.write_bytes(b"[]"),
        lambda: path.write_bytes(b" " * (layout.DECISION_FILE_MAX_BYTES + 1)),
        lambda: os.mkfifo(path, 0o600),
        lambda: path.mkdir(),
    ):
        make()
        (problem,) = store.verify()
        assert (problem.kind, problem.path, problem.fixed) == (
            "decision_file",
            layout.DECISION_FILE,
            False,
        )
        assert os.path.lexists(path), "reported, not touched, without fix"
        (fixed,) = store.verify(fix=True)
        assert fixed.fixed and not os.path.lexists(path)
        assert store.verify() == []


def test_verify_removes_a_small_files_replacement_left_over_by_a_killed_writer(open_disk):
    store = open_disk()
    old = store.namespace_dir / f".{layout.DECISION_FILE}.4242.0badf00d{layout.TEMP_SUFFIX}"
    fresh = store.namespace_dir / f".{layout.NAMESPACE_FILE}.4243.00c0ffee{layout.TEMP_SUFFIX}"
    old.write_bytes(DECISION)
    fresh.write_bytes(b"{}")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    (problem,) = store.verify(fix=True)
    assert (problem.kind, problem.path, problem.fixed) == ("stale_temp", old.name, True)
    assert not old.exists() and fresh.exists(), "a write in progress is left alone"


def test_small_file_temp_names_are_told_from_other_names():
    assert layout.small_file_temp_of(".decision.json.12.abcdef01.tmp") == "decision.json"
    assert layout.small_file_temp_of(".namespace.json.7.00000000.tmp") == "namespace.json"
    for name in ("decision.json", ".decision.json", ".decision.json.x.abcdef01.tmp", "a.tmp"):
        assert layout.small_file_temp_of(name) is None, name
