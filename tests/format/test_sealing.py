"""The sealed-record envelope: round trip, what the associated data binds, keys and names."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os

import pytest

from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format.record import (
    HEADER_BYTES,
    decode_header,
    encode_header,
    make_header,
    verify_payload,
)
from kvtier.format.sealing import (
    NAME_BYTES,
    KeyRing,
    MasterKey,
    is_sealed_namespace,
    sealed_namespace,
)
from tests.support.store import key_of, make_namespace, payload_of

SECRET_A = bytes(range(32))
SECRET_B = bytes(range(100, 132))
NS = sealed_namespace(make_namespace()).digest()
OTHER_NS = sealed_namespace(make_namespace("other/model")).digest()


def ring(*secrets: bytes) -> KeyRing:
    return KeyRing([MasterKey(s) for s in secrets or (SECRET_A,)])


def sealed_record(sealer, block_key: bytes, payload: bytes, ns: bytes = NS) -> bytes:
    """A whole sealed record (header + ciphertext) as a store writes it."""
    name = sealer.name(ns, block_key)
    header, body = sealer.seal(ns, name, payload)
    return encode_header(header) + bytes(body)


def open_record(sealer, record: bytes, block_key: bytes, ns: bytes = NS) -> bytes:
    """Read a record the way a store does: by the name of ``block_key``."""
    name = sealer.name(ns, block_key)
    header = decode_header(record[:HEADER_BYTES], ns, name, len(record) - HEADER_BYTES)
    out = memoryview(bytearray(record[HEADER_BYTES:]))
    sealer.open(header, out, out)
    return bytes(out)


def forged(record: bytes, **changes: object) -> bytes:
    """``record`` with header fields changed and its (keyless) header checksum redone: what
    someone with write access but no key can make."""
    header = decode_header(record[:HEADER_BYTES], NS, _name_in(record))
    return encode_header(dataclasses.replace(header, **changes)) + record[HEADER_BYTES:]


def _name_in(record: bytes) -> bytes:
    return record[48 : 48 + int.from_bytes(record[14:16], "little")]


def test_a_sealed_record_round_trips_and_holds_no_plaintext() -> None:
    sealer = ring().tenant()
    record = sealed_record(sealer, key_of(1), payload_of(1))
    assert len(record) == HEADER_BYTES + len(payload_of(1))
    assert open_record(sealer, record, key_of(1)) == payload_of(1)
    assert payload_of(1)[:64] not in record


def test_a_record_holds_neither_the_block_key_nor_its_hex() -> None:
    # A hash-like key: key_of's are mostly zero bytes, which the header's padding holds.
    block_key = hashlib.sha256(b"prompt").digest() + bytes(4)
    record = sealed_record(ring().tenant(), block_key, payload_of(7))
    for form in (block_key, block_key[:32]):
        assert form not in record and form.hex().encode() not in record


def test_names_are_short_macs_that_differ_per_tenant_namespace_and_key() -> None:
    a = ring(SECRET_A)
    names = {
        a.tenant().name(NS, key_of(1)),
        a.tenant("salt-1").name(NS, key_of(1)),
        a.tenant("").name(NS, key_of(1)),
        a.tenant().name(OTHER_NS, key_of(1)),
        ring(SECRET_B).tenant().name(NS, key_of(1)),
        a.tenant().name(NS, key_of(2)),
    }
    assert len(names) == 6
    assert all(len(n) == NAME_BYTES for n in names)
    assert a.tenant().name(NS, key_of(1)) == ring(SECRET_A).tenant().name(NS, key_of(1))


def test_a_flipped_ciphertext_byte_fails_authentication() -> None:
    sealer = ring().tenant()
    record = bytearray(sealed_record(sealer, key_of(1), payload_of(1)))
    record[HEADER_BYTES + 100] ^= 0x01
    with pytest.raises(CorruptRecordError) as caught:
        open_record(sealer, bytes(record), key_of(1))
    assert caught.value.reason == "auth"


@pytest.mark.parametrize("field", ["salt", "nonce", "tag"])
def test_a_changed_seal_field_fails_authentication(field: str) -> None:
    sealer = ring().tenant()
    record = sealed_record(sealer, key_of(1), payload_of(1))
    seal = decode_header(record[:HEADER_BYTES], NS, _name_in(record)).seal
    assert seal is not None
    changed = bytes([getattr(seal, field)[0] ^ 1]) + getattr(seal, field)[1:]
    bad = forged(record, seal=dataclasses.replace(seal, **{field: changed}))
    with pytest.raises(CorruptRecordError) as caught:
        open_record(sealer, bad, key_of(1))
    assert caught.value.reason == "auth"


def test_a_record_moved_under_another_block_key_fails_authentication() -> None:
    sealer = ring().tenant()
    record = sealed_record(sealer, key_of(1), payload_of(1))
    moved = forged(record, key=sealer.name(NS, key_of(2)))  # header rewritten for key 2
    with pytest.raises(CorruptRecordError) as caught:
        open_record(sealer, moved, key_of(2))
    assert caught.value.reason == "auth"


def test_a_record_moved_unchanged_under_another_name_fails_its_key_check() -> None:
    sealer = ring().tenant()
    record = sealed_record(sealer, key_of(1), payload_of(1))
    with pytest.raises(CorruptRecordError) as caught:
        open_record(sealer, record, key_of(2))
    assert caught.value.reason == "key"


def test_a_record_copied_into_another_namespace_fails_authentication() -> None:
    sealer = ring().tenant()
    record = sealed_record(sealer, key_of(1), payload_of(1))
    header = decode_header(record[:HEADER_BYTES], NS, _name_in(record))
    copied = (
        encode_header(
            dataclasses.replace(
                header, namespace_digest=OTHER_NS, key=sealer.name(OTHER_NS, key_of(1))
            )
        )
        + record[HEADER_BYTES:]
    )
    with pytest.raises(CorruptRecordError) as caught:
        open_record(sealer, copied, key_of(1), ns=OTHER_NS)
    assert caught.value.reason == "auth"


def test_swapped_ciphertexts_fail_authentication() -> None:
    sealer = ring().tenant()
    one = sealed_record(sealer, key_of(1), payload_of(1))
    two = sealed_record(sealer, key_of(2), payload_of(2))
    with pytest.raises(CorruptRecordError) as caught:
        open_record(sealer, one[:HEADER_BYTES] + two[HEADER_BYTES:], key_of(1))
    assert caught.value.reason == "auth"


def test_another_tenants_record_under_this_tenants_name_fails_authentication() -> None:
    keys = ring()
    theirs = sealed_record(keys.tenant("tenant-a"), key_of(1), payload_of(1))
    mine = keys.tenant("tenant-b")
    planted = forged(theirs, key=mine.name(NS, key_of(1)))
    with pytest.raises(CorruptRecordError) as caught:
        open_record(mine, planted, key_of(1))
    assert caught.value.reason == "auth"


def test_rotation_reads_records_of_an_older_key_and_writes_under_the_new_one() -> None:
    old = sealed_record(ring(SECRET_A).tenant(), key_of(1), payload_of(1))
    rotated = ring(SECRET_B, SECRET_A)
    sealer = rotated.tenant()
    assert sealer.names(NS, key_of(1))[1] == ring(SECRET_A).tenant().name(NS, key_of(1))
    name = sealer.names(NS, key_of(1))[1]
    header = decode_header(old[:HEADER_BYTES], NS, name)
    out = memoryview(bytearray(old[HEADER_BYTES:]))
    sealer.open(header, out, out)
    assert bytes(out) == payload_of(1)
    new = sealed_record(sealer, key_of(1), payload_of(1))
    new_header = decode_header(new[:HEADER_BYTES], NS, sealer.name(NS, key_of(1)))
    assert new_header.seal is not None and new_header.seal.key_id == rotated.write_key_id


def test_a_record_of_a_retired_key_fails_as_an_unknown_key_id() -> None:
    old = sealed_record(ring(SECRET_A).tenant(), key_of(1), payload_of(1))
    retired = ring(SECRET_B).tenant()
    header = decode_header(old[:HEADER_BYTES], NS, _name_in(old))
    out = memoryview(bytearray(old[HEADER_BYTES:]))
    with pytest.raises(CorruptRecordError) as caught:
        retired.open(header, out, out)
    assert caught.value.reason == "key_id"


def test_a_plain_reader_refuses_a_sealed_record_and_a_sealer_a_plain_one() -> None:
    sealer = ring().tenant()
    record = sealed_record(sealer, key_of(1), payload_of(1))
    header = decode_header(record[:HEADER_BYTES], NS, _name_in(record))
    with pytest.raises(CorruptRecordError) as caught:
        verify_payload(header, record[HEADER_BYTES:])
    assert caught.value.reason == "sealed"
    plain = make_header(NS, sealer.name(NS, key_of(1)), payload_of(1))
    out = memoryview(bytearray(payload_of(1)))
    with pytest.raises(CorruptRecordError) as caught:
        sealer.open(plain, out, out)
    assert caught.value.reason == "not_sealed"


def test_the_checksum_covers_the_ciphertext_so_verify_without_a_key_finds_bit_rot() -> None:
    from kvtier.format.record import verify_stored_bytes

    record = bytearray(sealed_record(ring().tenant(), key_of(1), payload_of(1)))
    header = decode_header(bytes(record[:HEADER_BYTES]), NS, _name_in(bytes(record)))
    verify_stored_bytes(header, record[HEADER_BYTES:])
    record[-1] ^= 0x80
    with pytest.raises(CorruptRecordError, match="checksum"):
        verify_stored_bytes(header, record[HEADER_BYTES:])


def test_sealed_namespaces_have_their_own_digest() -> None:
    plain = make_namespace()
    assert sealed_namespace(plain).digest() != plain.digest()
    assert is_sealed_namespace(sealed_namespace(plain)) and not is_sealed_namespace(plain)
    assert sealed_namespace(sealed_namespace(plain)) == sealed_namespace(plain)


def test_no_repr_shows_a_secret() -> None:
    keys = ring(SECRET_A, SECRET_B)
    shown = " ".join(
        [
            repr(keys),
            str(keys.keys[0]),
            repr(keys.keys[1]),
            repr(keys.tenant("t")),
            repr(keys.tenant("t")._keys[0]),
        ]
    )
    for secret in (SECRET_A, SECRET_B):
        assert secret.hex() not in shown and repr(secret) not in shown
    assert keys.write_key_id.hex() in shown


def test_a_master_key_of_the_wrong_size_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as caught:
        MasterKey(b"k" * 31)
    assert "kkkk" not in str(caught.value) and "openssl rand -hex 32" in str(caught.value)


def test_the_same_key_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="twice"):
        ring(SECRET_A, SECRET_A)


def test_each_record_gets_a_fresh_salt_and_nonce() -> None:
    sealer = ring().tenant()
    one = sealed_record(sealer, key_of(1), payload_of(1))
    two = sealed_record(sealer, key_of(1), payload_of(1))
    assert one[HEADER_BYTES:] != two[HEADER_BYTES:]


def test_a_master_key_is_not_pickled() -> None:
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(MasterKey(os.urandom(32)))


def test_a_larger_seal_while_the_last_ciphertext_is_still_viewed_works() -> None:
    # A thread seals into one reusable buffer and grows it for a larger record; a caller that
    # still holds the previous ciphertext's view must neither break that nor lose its bytes.
    # In a thread of its own: the buffer is the thread's, for every sealer, and an earlier
    # test's seal in this thread may have grown it past the larger record already.
    def seal_small_then_large() -> None:
        sealer = ring().tenant()
        small, large = payload_of(1, 4096), payload_of(2, 3 * 1024 * 1024)
        name = sealer.name(NS, key_of(1))
        header, body = sealer.seal(NS, name, small)
        kept = bytes(body)
        _, larger = sealer.seal(NS, sealer.name(NS, key_of(2)), large)
        assert bytes(body) == kept and larger.nbytes == len(large)
        out = memoryview(bytearray(body))
        sealer.open(header, out, out)
        assert bytes(out) == small

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as fresh_thread:
        fresh_thread.submit(seal_small_then_large).result()
