"""The contract every ``BlockStore`` passes (zarr's StoreTests shape).

A backend's test class inherits ``StoreContract`` and supplies ``make_store`` (a store whose
cap holds ``records`` records of PAYLOAD_BYTES), ``record_bytes`` (what one record of a given
payload size costs against the cap) and ``ground_truth`` (what the backend really holds, read
around the store's API: the record files decoded with kvtier.format, a server's values, the
internal dict). The tests check results against that ground truth, not only through the
store's own methods.
"""

from __future__ import annotations

import random
import threading
from array import array

from kvtier.store import BlockStore, StoreAbilities
from kvtier.store.base import FixedClaim
from tests.support.store import PAYLOAD_BYTES, aligned_buffer, key_of, payload_of


class StoreContract:
    """Behaviour shared by all stores; subclasses bind it to one backend."""

    def make_store(self, records: int = 8) -> BlockStore:
        raise NotImplementedError

    def record_bytes(self, payload_len: int) -> int:
        raise NotImplementedError

    def ground_truth(self, store: BlockStore) -> dict[bytes, bytes]:
        """key -> payload of every record ``store`` holds, read without its API."""
        raise NotImplementedError(
            f"{type(self).__name__} must supply ground_truth(store): the backend's records "
            f"read around the store's API (files, server values, the internal dict)"
        )

    def assert_truth(self, store: BlockStore, expected: dict[bytes, bytes | None]) -> None:
        """The backend holds exactly the keys the store lists, each key of ``expected`` with
        that payload (None: absent), and the store serves what the backend holds."""
        truth = self.ground_truth(store)
        assert sorted(truth) == sorted(store.keys())
        for key, payload in expected.items():
            assert truth.get(key) == payload, key.hex()[:16]
        for key, payload in truth.items():
            assert store.get(key) == payload, key.hex()[:16]

    def read(self, store: BlockStore, key: bytes, size: int = PAYLOAD_BYTES) -> bytes | None:
        out = aligned_buffer(size)
        return bytes(out) if store.get_into(key, out) else None

    def test_get_after_put_round_trips(self) -> None:
        store = self.make_store()
        assert store.put(key_of(1), payload_of(1))
        assert store.contains(key_of(1))
        assert self.read(store, key_of(1)) == payload_of(1)
        self.assert_truth(store, {key_of(1): payload_of(1)})

    def test_get_into_unaligned_buffer_round_trips(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        out = memoryview(bytearray(PAYLOAD_BYTES + 1))[1:]
        assert store.get_into(key_of(1), out)
        assert bytes(out) == payload_of(1)

    def test_typed_buffers_round_trip(self) -> None:
        store = self.make_store()
        floats = array("f", range(PAYLOAD_BYTES // 4))
        assert store.put(key_of(1), floats)
        out = array("f", bytes(PAYLOAD_BYTES))
        assert store.get_into(key_of(1), memoryview(out))
        assert out == floats
        self.assert_truth(store, {key_of(1): floats.tobytes()})

    def test_put_replaces_existing_record(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        assert store.put(key_of(1), payload_of(2))
        assert self.read(store, key_of(1)) == payload_of(2)
        self.assert_truth(store, {key_of(1): payload_of(2)})

    def test_duplicate_put_is_charged_once(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        store.put(key_of(1), payload_of(1))
        assert store.used_bytes() == self.record_bytes(PAYLOAD_BYTES)
        assert list(store.keys()) == [key_of(1)]
        self.assert_truth(store, {key_of(1): payload_of(1)})

    def test_get_of_unknown_key_is_miss(self) -> None:
        store = self.make_store()
        assert not store.contains(key_of(9))
        assert self.read(store, key_of(9)) is None
        assert store.stats().misses == 1

    def test_get_into_wrong_length_buffer_is_miss(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        assert self.read(store, key_of(1), PAYLOAD_BYTES - 4096) is None
        assert store.contains(key_of(1))

    def test_get_returns_bytes_or_none(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        assert store.get(key_of(1)) == payload_of(1)
        assert store.get(key_of(2)) is None

    def test_delete_removes_record(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        assert store.delete(key_of(1))
        assert not store.contains(key_of(1))
        assert self.read(store, key_of(1)) is None
        assert store.used_bytes() == 0
        self.assert_truth(store, {key_of(1): None})

    def test_delete_of_unknown_key_returns_false(self) -> None:
        assert not self.make_store().delete(key_of(1))

    def test_keys_lists_stored_keys(self) -> None:
        store = self.make_store()
        for i in range(3):
            store.put(key_of(i), payload_of(i))
        store.delete(key_of(1))
        assert sorted(store.keys()) == [key_of(0), key_of(2)]
        self.assert_truth(
            store, {key_of(0): payload_of(0), key_of(1): None, key_of(2): payload_of(2)}
        )

    def test_used_bytes_counts_every_record(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        store.put(key_of(2), payload_of(2, 4096))
        assert store.used_bytes() == self.record_bytes(PAYLOAD_BYTES) + self.record_bytes(4096)

    def test_payload_larger_than_cap_is_refused(self) -> None:
        store = self.make_store(records=2)
        assert not store.put(key_of(1), bytes(3 * PAYLOAD_BYTES + 8192))
        assert store.stats().put_failures == 1
        assert store.used_bytes() == 0

    def test_cap_is_never_exceeded(self) -> None:
        store = self.make_store(records=4)
        rng = random.Random(7)
        cap = 4 * self.record_bytes(PAYLOAD_BYTES)
        for i in range(60):
            assert store.put(key_of(i), payload_of(i, rng.choice([1024, 4096, PAYLOAD_BYTES])))
            assert store.used_bytes() <= cap
        assert store.stats().evictions > 0
        truth = self.ground_truth(store)
        assert 0 < sum(self.record_bytes(len(p)) for p in truth.values()) <= cap
        self.assert_truth(store, {})

    def test_put_many_stores_each_record_and_says_which(self) -> None:
        store = self.make_store(records=2)
        keys = [key_of(1), key_of(2), key_of(3)]
        payloads = [payload_of(1), bytes(3 * PAYLOAD_BYTES + 8192), payload_of(3)]
        assert store.put_many(keys, payloads) == [True, False, True]
        assert store.stats().put_failures == 1
        assert store.used_bytes() == 2 * self.record_bytes(PAYLOAD_BYTES)
        self.assert_truth(
            store, {key_of(1): payload_of(1), key_of(2): None, key_of(3): payload_of(3)}
        )

    def test_put_many_evicts_to_stay_under_the_cap(self) -> None:
        store = self.make_store(records=4)
        cap = 4 * self.record_bytes(PAYLOAD_BYTES)
        assert store.put_many([key_of(i) for i in range(4)], [payload_of(i) for i in range(4)])
        assert (
            store.put_many([key_of(i) for i in range(4, 7)], [payload_of(i) for i in range(4, 7)])
            == [True] * 3
        )
        assert store.used_bytes() <= cap
        if store.abilities.capacity:  # else the server evicts, by its own policy
            assert store.stats().evictions > 0
        self.assert_truth(store, {key_of(i): payload_of(i) for i in range(4, 7)})

    def test_put_many_of_a_key_twice_keeps_the_later_payload(self) -> None:
        store = self.make_store()
        keys = [key_of(1), key_of(2), key_of(1)]
        outcomes = store.put_many(keys, [payload_of(1), payload_of(2), payload_of(3)])
        assert outcomes == [True, True, True]
        assert store.used_bytes() == 2 * self.record_bytes(PAYLOAD_BYTES)
        self.assert_truth(store, {key_of(1): payload_of(3), key_of(2): payload_of(2)})

    def test_put_many_needs_one_payload_per_key(self) -> None:
        store = self.make_store()
        try:
            store.put_many([key_of(1), key_of(2)], [payload_of(1)])
        except ValueError as exc:
            assert "2 keys for 1 payloads" in str(exc)
        else:
            raise AssertionError("put_many accepted 2 keys for 1 payload")
        assert list(store.keys()) == []

    def test_least_recently_used_is_evicted_first(self) -> None:
        store = self.make_store(records=4)
        for i in range(4):
            store.put(key_of(i), payload_of(i))
        assert self.read(store, key_of(0)) == payload_of(0)
        store.put(key_of(4), payload_of(4))
        assert store.contains(key_of(0))
        assert not store.contains(key_of(1))
        assert store.contains(key_of(4))
        self.assert_truth(
            store, {key_of(0): payload_of(0), key_of(1): None, key_of(4): payload_of(4)}
        )

    def test_concurrent_puts_and_gets_stay_consistent(self) -> None:
        store = self.make_store(records=16)
        errors: list[str] = []

        def worker(offset: int) -> None:
            for i in range(offset, offset + 40):
                store.put(key_of(i % 24), payload_of(i % 24))
                data = self.read(store, key_of((i * 7) % 24))
                if data is not None and data != payload_of((i * 7) % 24):
                    errors.append(f"wrong bytes for {(i * 7) % 24}")

        threads = [threading.Thread(target=worker, args=(n * 10,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.used_bytes() <= 16 * self.record_bytes(PAYLOAD_BYTES)
        assert [p for p in store.verify() if not p.fixed] == []
        truth = self.ground_truth(store)
        assert all(v == payload_of(int.from_bytes(k[:32], "big")) for k, v in truth.items())
        self.assert_truth(store, {})

    def test_closed_store_misses_and_refuses_puts(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        store.close()
        assert self.read(store, key_of(1)) is None
        assert not store.put(key_of(2), payload_of(2))
        store.close()  # idempotent

    def test_key_that_is_not_bytes_is_a_programming_error(self) -> None:
        store = self.make_store()
        for bad in ("text", b"", bytes(300)):
            try:
                store.put(bad, payload_of(1))  # type: ignore[arg-type]
            except ValueError as exc:
                assert "key must be" in str(exc)
            else:
                raise AssertionError(f"put accepted key {bad!r:.20}")

    def test_abilities_match_what_the_store_does(self) -> None:
        """What a store declares in ``abilities`` is what its methods answer."""
        store = self.make_store()
        abilities = store.abilities
        assert isinstance(abilities, StoreAbilities)
        assert (store.capacity_bytes > 0) == abilities.capacity, store.capacity_bytes
        assert bool(store.parts()) == abilities.parts
        store.put(key_of(1), payload_of(1))
        assert key_of(1) in store.exists_many([key_of(1), key_of(2)])
        assert key_of(2) not in store.exists_many([key_of(2)])
        if not abilities.remote_lookup:  # contains knows every key: nothing more to ask
            assert store.exists_many([key_of(1), key_of(2)]) == {key_of(1)}

    def test_a_refused_claim_leaves_the_destination_untouched(self) -> None:
        store = self.make_store()
        store.put(key_of(1), payload_of(1))
        out, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
        out[:] = bytes(PAYLOAD_BYTES)
        assert not store.get_into_when(key_of(1), out, FixedClaim(grant=False), bounce)
        assert bytes(out) == bytes(PAYLOAD_BYTES)
        assert store.get_into_when(key_of(1), out, FixedClaim(), bounce)
        assert bytes(out) == payload_of(1)
