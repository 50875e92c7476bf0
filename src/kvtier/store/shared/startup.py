"""Start-up of the shared tier: connect, read the server's memory settings, cap record size.

Fails closed: anything that would make the tier useless or dangerous raises ``ConfigError``
naming the option and the fix. Only the redacted URL and scrubbed messages get printed.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError

from kvtier.errors import ConfigError
from kvtier.format.record import HEADER_BYTES
from kvtier.settings import SharedTierSettings
from kvtier.store.shared.client import build_cluster, build_standalone

log = logging.getLogger("kvtier.store.shared")

#: Record cap used when the server's maxmemory cannot be read and none is configured.
FALLBACK_MAX_RECORD_BYTES = 64 * 2**20
#: Server settings read at start-up (where CONFIG is permitted).
SETTINGS = ("maxmemory", "maxmemory-policy", "proto-max-bulk-len")
#: The oldest Redis release the shared tier is tested on (any Valkey release is newer).
OLDEST_TESTED_REDIS = (6, 2)
#: Said wherever a server is too old or untested.
SUPPORTED_SERVERS = "Redis >= 6.2 or Valkey >= 7.2 (tested: Redis 6.2 and 7.0, Valkey 8.1 and 9.1)"


def scrub(text: str, config: SharedTierSettings) -> str:
    """``text`` with the password masked (a server's error text could echo it back)."""
    secret = config.password_text
    return text.replace(secret, "***") if secret else text


def connect(config: SharedTierSettings) -> redis.Redis | RedisCluster:
    """A client that has answered PING; ``ConfigError`` naming the option to fix otherwise."""
    server = config.server
    where = server.redacted
    try:
        client = build_cluster(config) if server.cluster else build_standalone(config)
        client.ping()
        return client
    except (AuthenticationError, AuthorizationError, NoPermissionError) as exc:
        raise ConfigError(
            f"shared tier: the server at url={where} refused the credentials "
            f"({type(exc).__name__}: {scrub(str(exc), config)}); fix the username/password "
            "options or the server's ACL"
        ) from None
    except Exception as exc:  # anything else at start-up: unreachable or misconfigured
        text = scrub(str(exc), config)
        if "unknown command" in text and "HELLO" in text.upper():
            # redis-py opens every connection with HELLO 3 (RESP3), which Redis has since 6.0.
            fix = f"the server is older than Redis 6.0; use {SUPPORTED_SERVERS}"
        elif any(w in text for w in ("SSL", "certificate", "TLS", "tls")):
            fix = "check tls_ca_file/tls_cert_file/tls_key_file and that the server speaks TLS"
        elif "AUTH" in text or "HELLO" in text:
            fix = "give the username/password options the server expects"
        else:
            fix = "start the server, or fix the url option (host, port, scheme)"
        raise ConfigError(
            f"shared tier: cannot use url={where} ({type(exc).__name__}: {text:.300}); {fix}"
        ) from None


def warn_if_untested(client: redis.Redis | RedisCluster, config: SharedTierSettings) -> None:
    """Log a warning when a master runs a Redis release older than the tested ones (one that
    speaks RESP3 but predates 6.2); say nothing when INFO is not permitted (an ACL user)."""
    try:
        releases = {release_of(master.info("server")) for master in masters(client)}
    except Exception:
        return
    for product, release in sorted(releases):
        if product == "Redis" and _numbers(release) < OLDEST_TESTED_REDIS:
            log.warning(
                "shared tier: %s runs Redis %s, older than any release kvtier is tested on; use %s",
                config.server.redacted,
                release,
                SUPPORTED_SERVERS,
            )


def release_of(info: dict[str, Any]) -> tuple[str, str]:
    """("Valkey", "9.1.2") or ("Redis", "7.0.15") from INFO server (Valkey also answers a
    Redis-compatible ``redis_version``)."""
    if "valkey_version" in info:
        return "Valkey", str(info["valkey_version"])
    return "Redis", str(info.get("redis_version", "0"))


def _numbers(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split(".")[:2] if part.isdigit())


def masters(client: redis.Redis | RedisCluster) -> list[Any]:
    """One plain client per master (the client itself when standalone)."""
    if isinstance(client, RedisCluster):
        return [node.redis_connection for node in client.get_primaries()]
    return [client]


def server_settings(
    client: redis.Redis | RedisCluster, config: SharedTierSettings
) -> list[dict[str, str]]:
    """``SETTINGS`` of every master; [] when CONFIG is not permitted (an ACL user) or fails."""
    settings = []
    try:
        for master in masters(client):
            got: dict[str, str] = {}
            for name in SETTINGS:
                got.update({_text(k): _text(v) for k, v in master.config_get(name).items()})
            settings.append(got)
    except Exception as exc:
        log.info(
            "shared tier: cannot read the server's settings (%s: %s); "
            "give max_record_bytes to cap record size",
            type(exc).__name__,
            scrub(str(exc), config)[:200],
        )
        return []
    return settings


def record_cap(settings: list[dict[str, str]], config: SharedTierSettings, block_bytes: int) -> int:
    """The largest record put may send; warns about settings that make a poor cache.

    ``max_record_bytes`` when given, else 1/8 of the smallest master's maxmemory and half its
    ``proto-max-bulk-len`` (a value over maxmemory would evict the whole cache, itself
    included; one over proto-max-bulk-len drops the connection). Raises ``ConfigError`` when
    one record of ``block_bytes`` payload would not fit.
    """
    where = config.server.redacted
    limits = []
    for got in settings:
        maxmemory = int(got.get("maxmemory", "0") or 0)
        if maxmemory == 0:
            log.warning(
                "shared tier: %s has maxmemory 0 (no limit): the server grows until the "
                "machine runs out of memory; set maxmemory and maxmemory-policy allkeys-lru",
                where,
            )
        else:
            limits.append(maxmemory // 8)
        if got.get("maxmemory-policy") == "noeviction":
            log.warning(
                "shared tier: %s has maxmemory-policy noeviction: once full, every put fails "
                "instead of evicting; use allkeys-lru",
                where,
            )
        bulk = int(got.get("proto-max-bulk-len", "0") or 0)
        if bulk:
            limits.append(bulk // 2)
    if config.max_record_bytes is not None:
        cap = config.max_record_bytes
    else:
        cap = min(limits) if limits else FALLBACK_MAX_RECORD_BYTES
    needed = HEADER_BYTES + block_bytes
    if needed > cap:
        raise ConfigError(
            f"shared tier: one record of this model is {needed} bytes, over the record cap "
            f"of {cap} bytes (max_record_bytes, or 1/8 of the server's maxmemory at {where}); "
            "raise the server's maxmemory or max_record_bytes"
        )
    return cap


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
