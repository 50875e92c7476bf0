"""``RecordWriter.write_records``: a batch of record files written and published, by the native
writer where it is built and by the Python steps otherwise, with the same files, modes and
errors either way; ``remove_many`` likewise for the files it unlinks."""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import pytest

from kvtier.format.record import HEADER_BYTES
from kvtier.native import files_unlinker, records_writer
from kvtier.store.disk import writer as writer_module
from kvtier.store.disk.writer import RecordWriter

PAGE = mmap.PAGESIZE


class PythonStepsWriter(RecordWriter):
    """The Python steps, forced: a subclass that overrides a step never takes the native path."""

    def publish(self, temp: Path, final: Path) -> None:
        super().publish(temp, final)


WRITERS = [
    pytest.param(
        RecordWriter,
        id="native",
        marks=pytest.mark.skipif(records_writer() is None, reason="native writer not built"),
    ),
    pytest.param(PythonStepsWriter, id="python"),
]


def aligned_payload(size: int, fill: int) -> memoryview:
    buf = mmap.mmap(-1, size)
    buf.write(bytes([fill]) * size)
    return memoryview(buf)


def test_a_subclass_overriding_a_step_keeps_the_python_steps() -> None:
    assert PythonStepsWriter()._native is None
    assert RecordWriter(fsync="always")._native is None
    assert (RecordWriter()._native is None) == (records_writer() is None)


@pytest.mark.parametrize("writer_class", WRITERS)
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_records_are_published_whole_and_private(
    tmp_path: Path, writer_class: type[RecordWriter], aligned: bool
) -> None:
    writer = writer_class()
    records = []
    for i in range(3):
        header = bytes([0x40 + i]) * HEADER_BYTES
        payload = aligned_payload(2 * PAGE, i) if aligned else memoryview(bytes([i]) * 1000)
        records.append((tmp_path / f"t{i}", tmp_path / f"r{i}", header, payload))
    old_umask = os.umask(0)
    try:
        assert writer.write_records(records) == [None, None, None]
    finally:
        os.umask(old_umask)
    for temp, final, header, payload in records:
        assert not temp.exists()
        assert final.read_bytes() == header + bytes(payload)
        assert stat.S_IMODE(final.stat().st_mode) == 0o600


@pytest.mark.parametrize("writer_class", WRITERS)
def test_a_missing_folder_is_created_and_a_failed_record_fails_alone(
    tmp_path: Path, writer_class: type[RecordWriter]
) -> None:
    writer = writer_class()
    header = b"h" * HEADER_BYTES
    payload = aligned_payload(PAGE, 7)
    records = [
        (tmp_path / "t0", tmp_path / "new-folder" / "r0", header, payload),  # folder made
        (tmp_path / "absent" / "t1", tmp_path / "r1", header, payload),  # cannot create
        (tmp_path / "t2", tmp_path / "r2", header, payload),
    ]
    errors = writer.write_records(records)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], FileNotFoundError)
    assert (tmp_path / "new-folder" / "r0").read_bytes() == header + bytes(payload)
    assert (tmp_path / "r2").exists() and not (tmp_path / "r1").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new-folder", "r2"]


@pytest.mark.parametrize("writer_class", WRITERS)
def test_an_existing_temp_file_is_never_overwritten(
    tmp_path: Path, writer_class: type[RecordWriter]
) -> None:
    (tmp_path / "t0").write_bytes(b"someone else's")
    errors = writer_class().write_records(
        [(tmp_path / "t0", tmp_path / "r0", b"h" * HEADER_BYTES, aligned_payload(PAGE, 1))]
    )
    assert isinstance(errors[0], FileExistsError)
    assert (tmp_path / "t0").read_bytes() == b"someone else's"
    assert not (tmp_path / "r0").exists()


def test_the_native_writer_and_the_python_steps_write_the_same_bytes(tmp_path: Path) -> None:
    if records_writer() is None:
        pytest.skip("native writer not built")
    header = bytes(range(256)) * (HEADER_BYTES // 256)
    payload = aligned_payload(3 * PAGE, 9)
    for name, writer in (("native", RecordWriter()), ("python", PythonStepsWriter())):
        (tmp_path / name).mkdir()
        folder = tmp_path / name
        assert writer.write_records([(folder / "t", folder / "r", header, payload)]) == [None]
    assert (tmp_path / "native" / "r").read_bytes() == (tmp_path / "python" / "r").read_bytes()


def test_o_direct_refused_mid_batch_falls_back_to_buffered_writes_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Payloads taken for page-aligned that are not: the kernel refuses each O_DIRECT write
    (EINVAL), and every record of the batch is written buffered instead, the refusal warned
    about once."""
    if records_writer() is None:
        pytest.skip("native writer not built")
    monkeypatch.setattr("kvtier.store.disk.writer.aligned", lambda view: True)
    header = b"h" * HEADER_BYTES
    payloads = [memoryview(bytearray([i]) * (PAGE + 1))[1:] for i in range(3)]
    records = [(tmp_path / f"t{i}", tmp_path / f"r{i}", header, p) for i, p in enumerate(payloads)]
    writer = RecordWriter()
    with caplog.at_level("WARNING", logger="kvtier.store.disk.writer"):
        errors = writer.write_records(records)
    if writer._direct_writes_ok:
        pytest.skip(f"{tmp_path} takes unaligned O_DIRECT writes: nothing refused")
    refusals = [r for r in caplog.records if "O_DIRECT writes refused" in r.getMessage()]
    assert len(refusals) == 1
    assert errors == [None, None, None]
    for temp, final, _, payload in records:
        assert final.read_bytes() == header + bytes(payload) and not temp.exists()


@pytest.mark.parametrize(
    "native_unlink",
    [
        pytest.param(
            True,
            id="native",
            marks=pytest.mark.skipif(files_unlinker() is None, reason="native writer not built"),
        ),
        pytest.param(False, id="python"),
    ],
)
def test_remove_many_unlinks_in_order_and_keeps_what_it_cannot_with_a_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    native_unlink: bool,
) -> None:
    if not native_unlink:
        monkeypatch.setattr(writer_module, "files_unlinker", lambda: None)
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    (tmp_path / "folder").mkdir()
    paths = [tmp_path / "a", tmp_path / "missing", tmp_path / "folder", tmp_path / "b"]
    assert RecordWriter().remove_many(paths) == [True, True, False, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]
    assert "could not remove" in caplog.text and "folder" in caplog.text
    assert RecordWriter().remove(tmp_path / "a") and RecordWriter().remove_many([]) == []
