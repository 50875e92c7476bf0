"""Which tenant a request's records are sealed for: on the supported vLLM releases, always the
default tenant.

kvtier derives a data key and a name key per tenant (kvtier.format.sealing), a tenant being a
request's ``cache_salt``. vLLM's offloading does not tell a tier the salt: a tier sees a request
only as a ``ReqContext`` (``req_id``, ``kv_transfer_params``, ``kv_hints`` and the load filter),
which vLLM 0.32.0's scheduler builds in ``_create_req_context`` without ``Request.cache_salt``;
vLLM 0.25.1 hands a tier no request at all. So the tiers seal every record for the default
tenant. Tenants stay apart all the same in what they can *find*: vLLM mixes ``cache_salt`` into
the first block's hash, every later hash chains on it, so two salts never share a block key and
hence never a record name. What is lost is the cryptographic separation (one tenant's records
opened only with its own derived key) and ``require_cache_salt``, which needs to know whether a
request has a salt: ``EncryptionSettings`` refuses it at start-up, naming this reason.

Rejected: reading the salt from ``kv_transfer_params`` (a client could name any tenant there,
and it is not the salt vLLM hashes), or subclassing vLLM's connector to copy the salt in (a
patch of vLLM's scheduler internals, not an extension point).
"""

from __future__ import annotations

#: The tenant of every record the tiers write: ``KeyRing.tenant(None)``.
DEFAULT_TENANT: str | None = None
