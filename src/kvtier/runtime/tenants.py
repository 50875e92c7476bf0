"""Which tenant a request belongs to: the tag kvtier's connector puts on each request and the
one accessor the tiers read it with.

A tenant is a request's ``cache_salt`` (no salt: the default tenant). vLLM's offloading hands a
tier a request only as a ``ReqContext`` (request id, ``kv_transfer_params`` and, from API 0.32,
hints and a load filter); no ``cache_salt``. But the context's ``kv_transfer_params`` *is* the
request's own dict, so kvtier's connector (``kvtier.vllm.connector``, a subclass of vLLM's
``OffloadingConnector`` loaded by ``kv_connector_module_path``) writes a ``TenantTag`` under
``TENANT_KEY`` into that dict before vLLM builds the context, and every lookup, store and
load of that request then carries it.

The tag is a Python object, not a JSON value, on purpose: ``kv_transfer_params`` is also
settable by an HTTP client, which can put any JSON under ``TENANT_KEY`` but never a
``TenantTag``. So a client-supplied value is not trusted (``tenant_of`` returns None for it)
and the connector overwrites it anyway. An untagged request (another connector, a request the
connector never saw) counts as unsalted: it is the default tenant, and with
``require_cache_salt`` it is kept off the disk and shared tiers (fail closed).

The salt itself is client-supplied (an ordinary field of the request body): the boundary
between tenants is as strong as whatever sets it, normally a gateway in front of the engine.

On an encrypted tier each tenant's records are named and sealed under its own keys
(``KeyRing.tenant(cache_salt)``): the tier calls its store through the request's tenant view
(``TenantViews``; kvtier.store.tenant_view), one store, one cap and one eviction order for
all tenants. A plain tier needs none: vLLM already mixes the salt into the first block's hash,
so two tenants' block keys differ.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.format.sealing import RecordSealer
    from kvtier.store import BlockStore

#: The tenant of an unsalted request, ``KeyRing.tenant(None)``: a tier's store is opened with
#: its sealer, and a salted request's records are sealed under its own tenant's keys
#: (docs/encryption.md, "Tenants and cache_salt").
DEFAULT_TENANT: str | None = None
#: Tenant views a tier keeps (least recently used dropped first; a dropped one is made again).
VIEWS_KEPT = 1024

#: kvtier's key in a request's ``kv_transfer_params`` (namespaced: with vLLM's
#: ``MultiConnector`` every connector sees the same dict).
TENANT_KEY = "kvtier.tenant"


@dataclass(frozen=True, slots=True)
class TenantTag:
    """The tenant of one request, as kvtier's connector read it from ``Request.cache_salt``."""

    #: The request's ``cache_salt``; None for an unsalted request (the default tenant).
    cache_salt: str | None

    @property
    def salted(self) -> bool:
        return self.cache_salt is not None


def tagged_params(params: dict[str, Any] | None, cache_salt: str | None) -> dict[str, Any]:
    """``params`` (a request's ``kv_transfer_params``) with kvtier's tag for ``cache_salt``,
    replacing whatever was under ``TENANT_KEY``. The dict is changed in place when there is
    one (vLLM's request context may already hold it), else a new one is returned."""
    if params is None:
        params = {}
    params[TENANT_KEY] = TenantTag(cache_salt)
    return params


def tenant_of(params: Mapping[str, Any] | None) -> TenantTag | None:
    """The tag kvtier's connector set in ``params``; None when untagged or when the value
    under ``TENANT_KEY`` is not kvtier's (a client's JSON)."""
    if not params:
        return None
    tag = params.get(TENANT_KEY)
    return tag if isinstance(tag, TenantTag) else None


def salt_of(tag: TenantTag | None) -> str | None:
    """The tenant a tag names: its salt, or ``DEFAULT_TENANT`` for an untagged request."""
    return DEFAULT_TENANT if tag is None else tag.cache_salt


class TenantViews:
    """Each tenant's view of a tier's store (``BlockStore.tenant_view``); thread-safe.

    Built with the tier's key ring's ``tenant`` (salt -> sealer) on an encrypted tier; without
    one (a plain tier) every tenant gets the store itself. The default tenant gets the store
    itself too: the store is opened with its sealer.
    """

    def __init__(
        self,
        sealer_of: Callable[[str | None], RecordSealer] | None,
        max_views: int = VIEWS_KEPT,
    ) -> None:
        self._sealer_of = sealer_of
        self._max_views = max_views
        self._lock = threading.Lock()
        self._views: OrderedDict[str, tuple[BlockStore, BlockStore]] = OrderedDict()

    def of(self, store: BlockStore, cache_salt: str | None) -> BlockStore:
        """``store`` as the tenant of ``cache_salt`` sees it."""
        if self._sealer_of is None or cache_salt is DEFAULT_TENANT:
            return store
        with self._lock:
            kept = self._views.get(cache_salt)
            if kept is not None and kept[0] is store:
                self._views.move_to_end(cache_salt)
                return kept[1]
        view = store.tenant_view(self._sealer_of(cache_salt))
        with self._lock:
            self._views[cache_salt] = (store, view)
            self._views.move_to_end(cache_salt)
            if len(self._views) > self._max_views:
                self._views.popitem(last=False)
        return view
