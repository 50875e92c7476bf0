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

From vLLM 0.26 on, the connector builds its offloading spec from an ``OffloadingConfig``, which
says nothing of the engine's longest prompt or its steps in flight; kvtier's CUDA spec and its
tiers read those from vLLM's current config (``Release.engine_vllm_config``). The engine's
scheduler process builds its connector with no config current, so the connector makes its own
current while it builds (never replacing one already current).
"""

from __future__ import annotations

import contextlib
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


def config_current(vllm_config: Any) -> contextlib.AbstractContextManager[Any]:
    """vLLM's ``set_current_vllm_config(vllm_config)``, where no config is current yet."""
    from vllm.config import get_current_vllm_config_or_none, set_current_vllm_config

    if vllm_config is None or get_current_vllm_config_or_none() is not None:
        return contextlib.nullcontext()
    return set_current_vllm_config(vllm_config)


class KvtierConnector(OffloadingConnector):
    """``OffloadingConnector`` whose scheduler side tags each request with its tenant."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        with config_current(vllm_config):
            super().__init__(vllm_config, *args, **kwargs)

    def on_new_request(self, request: Any) -> None:
        tag_request(request)
        super().on_new_request(request)

    def request_finished(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        tag_request(request)
        return super().request_finished(request, *args, **kwargs)

    def request_finished_all_groups(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        tag_request(request)
        return super().request_finished_all_groups(request, *args, **kwargs)
