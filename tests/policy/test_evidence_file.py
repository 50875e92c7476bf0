"""kvtier.policy.evidence_file: an earlier process's measurements, saved and adopted safely.

A saved file must give a fresh policy the same picture the writer had, and a file that is not
this engine's (another namespace, device or format version) or is damaged must be refused with
a reason, never half-read. Writes are private and atomic.
"""

import json
import math
import os
import stat
from pathlib import Path

import pytest

from kvtier.policy import (
    MeasuredLoad,
    MeasuredStep,
    PolicyEvidence,
    PrefillCoefficients,
    RestorePolicy,
)
from kvtier.policy.evidence_file import (
    FORMAT,
    VERSION,
    EvidenceFile,
    EvidenceRejected,
    decode,
    encode,
    load,
    save,
)
from kvtier.policy.prefill import KEPT_STEPS, attended_pairs
from kvtier.store.disk import layout
from kvtier.store.disk.layout import DECISION_FILE, DECISION_FILE_MAX_BYTES
from tests.support.policy import predict_restore_s

NS = "0123456789abcdef0123456789abcdef"
DEVICE = "cuda: NVIDIA H200"
MIB = 1 << 20
#: What the writer's engine really costs: 20 us a token and a little attention.
ENGINE = PrefillCoefficients(step_s=0.002, per_token_s=2e-5, per_pair_s=3e-10)


def engine_seconds(cached: int, new: int) -> float:
    return ENGINE.step_seconds([(cached, new)])


def measured_policy() -> RestorePolicy:
    """A policy that timed a few prompts and a few disk loads (200 MB/s + 2 ms)."""
    policy = RestorePolicy()
    policy.add_tier("disk")
    for cached, new in [(0, 2048), (0, 8192), (4096, 4096), (0, 512), (16384, 8192)]:
        assert policy.observe_prefill([(cached, new)], engine_seconds(cached, new))
    for nbytes in (4 * MIB, 64 * MIB, 16 * MIB):
        policy.observe_load("disk", nbytes, 0.002 + nbytes / 2e8)
    return policy


def record(policy: RestorePolicy, namespace: str = NS, device: str = DEVICE) -> EvidenceFile:
    return EvidenceFile(namespace, device, 1_764_590_000.0, policy.evidence())


@pytest.fixture
def path(tmp_path: Path) -> Path:
    folder = tmp_path / "ns"
    folder.mkdir(mode=0o700)
    return folder / DECISION_FILE


def test_a_saved_file_gives_a_fresh_policy_the_writers_picture(path):
    writer = measured_policy()
    save(path, record(writer))
    loaded = load(path, NS, DEVICE)
    assert loaded is not None and loaded.saved_at_s == 1_764_590_000.0
    fresh = RestorePolicy()
    fresh.add_tier("disk")
    adopted = fresh.adopt(loaded.evidence)
    assert adopted.prefill_steps == 5 and adopted.tier_loads == {"disk": 3}
    assert fresh.prefill.evidence == pytest.approx(writer.prefill.evidence)
    for cached, new in [(0, 2048), (0, 32768), (8192, 8192)]:
        assert fresh.prefill.recompute_seconds(cached, new) == pytest.approx(
            writer.prefill.recompute_seconds(cached, new), rel=1e-4
        )
    for nbytes in (MIB, 256 * MIB):
        assert predict_restore_s(fresh, "disk", nbytes) == pytest.approx(
            predict_restore_s(writer, "disk", nbytes), rel=1e-4
        )
    # The writer knew its disk, the fresh policy without the file only the slow prior.
    unmeasured = RestorePolicy()
    unmeasured.add_tier("disk")
    assert predict_restore_s(unmeasured, "disk", 256 * MIB) != pytest.approx(
        predict_restore_s(fresh, "disk", 256 * MIB), rel=0.1
    )


def test_adopted_steps_fade_under_new_measurements():
    old = RestorePolicy()
    for n in (1024, 2048, 4096, 8192):
        old.observe_prefill([(0, n)], 10 * engine_seconds(0, n))  # a 10x slower machine
    fresh = RestorePolicy()
    fresh.adopt(old.evidence())
    assert fresh.prefill.recompute_seconds(0, 4096) > 5 * (engine_seconds(0, 4096) - 0.002)
    for i in range(6 * 32):  # six half-lives of the default fit
        n = 1024 * (1 + i % 8)
        fresh.observe_prefill([(0, n)], engine_seconds(0, n))
    truth = ENGINE.per_token_s * 4096 + ENGINE.per_pair_s * attended_pairs(0, 4096)
    assert fresh.prefill.recompute_seconds(0, 4096) == pytest.approx(truth, rel=0.1)


def test_loads_of_a_tier_the_fresh_policy_lacks_are_skipped():
    fresh = RestorePolicy()
    adopted = fresh.adopt(measured_policy().evidence())
    assert adopted.tier_loads == {}
    assert adopted.prefill_steps == 5


def test_a_missing_file_is_none_not_an_error(path):
    assert load(path, NS, DEVICE) is None


def test_the_file_is_private_whatever_the_umask(path):
    old = os.umask(0)
    try:
        save(path, record(measured_policy()))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [DECISION_FILE], "no temp file left"


@pytest.mark.parametrize(
    ("namespace", "device", "reason"),
    [
        ("f" * 32, DEVICE, "namespace"),
        (NS, "cuda: NVIDIA A100-SXM4-80GB", "another device"),
        (NS, "cpu: AMD EPYC 9654 x 16", "another device"),
    ],
)
def test_a_file_of_another_namespace_or_device_is_refused(path, namespace, device, reason):
    save(path, record(measured_policy(), namespace=namespace, device=device))
    with pytest.raises(EvidenceRejected, match=reason):
        load(path, NS, DEVICE)


@pytest.mark.parametrize("version", [0, 2, "1", True, None])
def test_a_file_of_another_format_version_is_refused(path, version):
    doc = json.loads(encode(record(measured_policy())))
    doc["version"] = version
    path.write_bytes(json.dumps(doc).encode())
    with pytest.raises(EvidenceRejected, match=f"format version .*reads {VERSION}"):
        load(path, NS, DEVICE)


def _damaged(change) -> bytes:  # type: ignore[no-untyped-def]
    doc = json.loads(encode(record(measured_policy())))
    change(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe not utf-8",
        b'{"format": "kvtier-decision-evidence", "version": 1, "namesp',  # torn
        b"[1, 2, 3]",
        b'{"format": "something else", "version": 1}',
        _damaged(lambda d: d["prefill_steps"].append({"seconds": -1.0, "segments": [[0, 9]]})),
        _damaged(lambda d: d["prefill_steps"].append({"seconds": 0.1, "segments": [[0, 0]]})),
        _damaged(lambda d: d["prefill_steps"].append({"seconds": 0.1, "segments": [[True, 9]]})),
        _damaged(lambda d: d["prefill_steps"].append({"seconds": 0.1, "segments": []})),
        _damaged(lambda d: d["tier_loads"]["disk"].append([4096, float("nan")])),
        _damaged(lambda d: d["tier_loads"]["disk"].append([4096])),
        _damaged(lambda d: d.update(tier_loads=[])),
        _damaged(lambda d: d.update(saved_at="yesterday")),
        _damaged(lambda d: d.update(prefill_steps=[{"seconds": 0.1}] * 2)),
    ],
)
def test_a_damaged_file_is_refused_whole(path, data):
    path.write_bytes(data)
    with pytest.raises(EvidenceRejected, match="damaged"):
        load(path, NS, DEVICE)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder", "huge"])
def test_a_planted_file_is_refused_without_following_or_waiting(path, tmp_path, kind):
    if kind == "fifo":
        os.mkfifo(path, 0o600)  # a blocking open would hang the opener thread
    elif kind == "symlink":
        target = tmp_path / "elsewhere.json"
        save(target, record(measured_policy()))
        path.symlink_to(target)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b" " * (DECISION_FILE_MAX_BYTES + 1))
    with pytest.raises(EvidenceRejected, match="unreadable"):
        load(path, NS, DEVICE)


def test_a_save_that_fails_before_its_rename_leaves_the_old_file(path, monkeypatch):
    first = measured_policy()
    save(path, record(first))
    before = path.read_bytes()
    second = measured_policy()
    second.observe_prefill([(0, 4000)], 1.0)

    def no_space(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layout.os, "rename", no_space)
    with pytest.raises(OSError, match="No space"):
        save(path, record(second))
    monkeypatch.undo()
    assert path.read_bytes() == before, "the old file is untouched"
    assert [p.name for p in path.parent.iterdir()] == [DECISION_FILE], "its temp file removed"


def test_a_long_history_is_trimmed_to_the_size_limit_keeping_the_newest(path):
    steps = tuple(
        MeasuredStep(tuple((i * 1000 + j, 4097 + i) for j in range(8)), 0.123456789 + i)
        for i in range(KEPT_STEPS)
    )
    loads = {f"tier{t}": tuple(MeasuredLoad(1 << 40, 1.0 + i) for i in range(50)) for t in "ab"}
    big = EvidenceFile(NS, DEVICE + " " * 200, 1.0, PolicyEvidence(steps, loads))
    data = encode(big)
    assert len(data) <= DECISION_FILE_MAX_BYTES
    kept = decode(data, NS, big.device).evidence
    assert kept.prefill_steps[-1].segments == steps[-1].segments, "the newest step is kept"
    assert kept.tier_loads["tiera"][-1].seconds == 50.0
    assert 0 < len(kept.prefill_steps) < len(steps)


def test_saved_times_are_rounded_not_truncated(path):
    policy = RestorePolicy()
    policy.observe_prefill([(0, 2048)], 0.123456789123)
    save(path, record(policy))
    (step,) = load(path, NS, DEVICE).evidence.prefill_steps
    assert step.seconds == 0.123457 and math.isclose(step.seconds, 0.123456789123, rel_tol=1e-5)
    assert json.loads(path.read_bytes())["format"] == FORMAT


def test_a_policy_keeps_only_its_newest_measurements_for_the_file():
    from kvtier.policy.restore import KEPT_LOADS

    policy = RestorePolicy()
    policy.add_tier("disk")
    for i in range(KEPT_STEPS + 10):
        policy.observe_prefill([(0, 100 + i)], 0.01)
    for i in range(KEPT_LOADS + 3):
        policy.observe_load("disk", MIB + i, 0.01)
    evidence = policy.evidence()
    assert [s.segments[0][1] for s in evidence.prefill_steps] == list(
        range(110, 100 + KEPT_STEPS + 10)
    )
    assert [load.nbytes - MIB for load in evidence.tier_loads["disk"]] == list(
        range(3, KEPT_LOADS + 3)
    )
    assert evidence.measurements == KEPT_STEPS + 10 + KEPT_LOADS + 3
    never_measured = RestorePolicy()
    never_measured.add_tier("host")
    assert never_measured.evidence().tier_loads == {}, "a prior is not evidence"
