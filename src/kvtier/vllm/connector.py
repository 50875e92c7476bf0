"""``KvtierConnector``: vLLM's ``OffloadingConnector`` that tells kvtier's tiers each request's
tenant.

Loaded through vLLM's ``kv_connector_module_path`` (``kvtier.kv_transfer_config()`` names it on
every platform). All offloading stays upstream's; the scheduler side only tags each request
with its tenant (``kvtier.runtime.tenants``) in the request's ``kv_transfer_params`` before
vLLM's scheduler side builds the request's context from that dict, overwriting any value a
client put under kvtier's key. vLLM's context holds the same dict, so the tag reaches every
lookup, store, load and promotion of the request; the tiers read it through the release
(``Release.request_tenant``).

vLLM's scheduler side builds a request's context in two places, both tagged here:
``on_new_request``, and ``request_finished`` for a request it never tracked (a fresh context
from the request). The other hooks use the context built on the new request. Tagging twice
writes the same tag.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)

from kvtier.runtime.tenants import tagged_params


def tag_request(request: Any) -> None:
    """Put the request's tenant (its ``cache_salt``) under kvtier's key in its
    ``kv_transfer_params``, replacing a client's value there."""
    request.kv_transfer_params = tagged_params(
        request.kv_transfer_params, getattr(request, "cache_salt", None)
    )


class KvtierConnector(OffloadingConnector):
    """``OffloadingConnector`` whose scheduler side tags each request with its tenant."""

    def on_new_request(self, request: Any) -> None:
        tag_request(request)
        super().on_new_request(request)

    def request_finished(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        tag_request(request)
        return super().request_finished(request, *args, **kwargs)

    def request_finished_all_groups(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        tag_request(request)
        return super().request_finished_all_groups(request, *args, **kwargs)
