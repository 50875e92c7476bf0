"""A stand-in for a shared store: a MemoryStore 'server' behind an in-memory view."""

from collections.abc import Iterable

from kvtier.store import MemoryStore, StoreAbilities


class FakeRemoteStore(MemoryStore):
    """``contains`` knows only keys this process stored or learned; ``exists_many`` asks the
    'server' (the MemoryStore itself), as the shared store does over the network."""

    abilities = StoreAbilities(remote_lookup=True, capacity=True)

    def __init__(self, capacity_bytes: int = 1 << 24) -> None:
        super().__init__(capacity_bytes)
        self.view: set[bytes] = set()
        self.asked: list[list[bytes]] = []

    def put(self, key, payload) -> bool:  # type: ignore[no-untyped-def]
        ok = super().put(key, payload)
        if ok:
            self.view.add(key)
        return ok

    def tenant_view(self, sealer: object) -> "FakeRemoteStore":
        """Itself: the fake holds plain records, which every tenant names alike (a sealed
        store's views are tested in tests/store and tests/shared)."""
        return self

    def without_server(self) -> None:
        return None  # it stands for a server

    def put_from_another_replica(self, key: bytes, payload: bytes) -> None:
        assert super().put(key, payload)

    def contains(self, key: bytes) -> bool:
        return key in self.view and super().contains(key)

    def exists_many(self, keys: Iterable[bytes]) -> set[bytes]:
        wanted = list(keys)
        self.asked.append(wanted)
        found = {k for k in wanted if MemoryStore.contains(self, k)}
        self.view |= found
        return found
