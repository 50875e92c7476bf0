"""Which servers the shared tier starts on: a server without RESP3 (older than Redis 6.0) is
refused with the releases to use, not a hint about credentials; a Redis older than the tested
ones starts with a warning; the tested servers start without one."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from kvtier.errors import ConfigError
from kvtier.settings import SharedTierSettings
from kvtier.store.shared import startup
from tests.support.redis_servers import RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import make_namespace

UNTESTED = "older than any release kvtier is tested on"


def test_a_server_without_hello_is_refused_naming_the_releases_to_use(
    fresh_server: Callable[..., RedisServer],
) -> None:
    # Renaming HELLO away answers as Redis 5 does: "unknown command 'HELLO'".
    server = fresh_server(extra_args=["--rename-command", "HELLO", '""'])
    with pytest.raises(ConfigError) as refused:
        open_shared(server.url, make_namespace())
    said = str(refused.value)
    assert "older than Redis 6.0" in said and startup.SUPPORTED_SERVERS in said
    assert "username/password" not in said


def test_a_tested_server_starts_without_a_release_warning(
    redis_standalone: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kvtier.store.shared"):
        open_shared(redis_standalone.url, make_namespace()).close()
    assert not [r for r in caplog.records if UNTESTED in r.getMessage()]


class _Master:
    """A client whose INFO answers what a server of some release would."""

    def __init__(self, info: dict[str, Any] | None) -> None:
        self._info = info

    def info(self, section: str) -> dict[str, Any]:
        assert section == "server"
        if self._info is None:
            raise PermissionError("NOPERM this user has no permissions to run 'info'")
        return self._info


@pytest.mark.parametrize(
    ("info", "warned"),
    [
        ({"redis_version": "6.0.20"}, True),
        ({"redis_version": "5.0.6"}, True),
        ({"redis_version": "6.2.14"}, False),
        ({"redis_version": "7.0.15"}, False),
        ({"redis_version": "7.2.4", "valkey_version": "8.1.8"}, False),
        (None, False),  # INFO not permitted: nothing to say
    ],
)
def test_only_a_redis_older_than_the_tested_ones_is_warned_about(
    info: dict[str, Any] | None, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    config = SharedTierSettings(url="redis://127.0.0.1:6379")
    with caplog.at_level(logging.WARNING, logger="kvtier.store.shared"):
        startup.warn_if_untested(_Master(info), config)  # type: ignore[arg-type]
    assert any(UNTESTED in r.getMessage() for r in caplog.records) is warned
