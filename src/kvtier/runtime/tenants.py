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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The tenant of an unsalted request, ``KeyRing.tenant(None)``; the tiers seal every record,
#: salted or not, under its keys (docs/encryption.md, "Tenants and cache_salt").
DEFAULT_TENANT: str | None = None

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
