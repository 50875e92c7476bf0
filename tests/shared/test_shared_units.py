"""Server-free units of the shared tier: the key view, the record packer, import hygiene."""

from __future__ import annotations

import subprocess
import sys

from kvtier.format import HEADER_BYTES
from kvtier.store.shared.client import RecordPacker, RecordValue
from kvtier.store.shared.view import KeyView


def test_view_keeps_the_most_recently_used_keys_and_their_bytes() -> None:
    view = KeyView(max_keys=2)
    view.remember(b"a", 10)
    view.remember(b"b", 20)
    view.remember(b"a", 10)  # a is now the most recent
    view.remember(b"c", 30)
    assert view.snapshot() == [b"a", b"c"]
    assert view.record_bytes == 2 * HEADER_BYTES + 40
    assert view.forget(b"a") and not view.forget(b"a")
    assert view.record_bytes == HEADER_BYTES + 30


def test_record_value_goes_out_as_its_parts_in_valid_resp() -> None:
    header, payload = b"H" * 10, memoryview(bytearray(b"P" * 7000))
    chunks = RecordPacker(lambda a: a.encode() if isinstance(a, str) else a).pack(
        "SET", b"k", RecordValue((header, payload))
    )
    assert any(isinstance(c, memoryview) and c.obj is payload.obj for c in chunks)  # no copy
    wire = b"".join(bytes(c) for c in chunks)
    assert wire == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$7010\r\n" + header + b"P" * 7000 + b"\r\n"


def test_packer_splits_multi_word_commands() -> None:
    chunks = RecordPacker(lambda a: a.encode() if isinstance(a, str) else a).pack(
        "CONFIG GET", "maxmemory"
    )
    assert b"".join(bytes(c) for c in chunks) == (
        b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$9\r\nmaxmemory\r\n"
    )


def test_shared_tier_imports_neither_vllm_nor_the_benches_nor_torch() -> None:
    code = (
        "import sys, kvtier.store.shared; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'benchmarks') "
        "or m.split('.')[:2] in (['kvtier', 'bench'], ['kvtier', 'probe'])]; print(bad)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_view_lists_its_oldest_keys_first() -> None:
    view = KeyView(max_keys=10)
    for key in (b"a", b"b", b"c"):
        view.remember(key, 1)
    view.remember(b"a", 1)
    assert view.oldest(2) == [b"b", b"c"]
