"""Options of the shared tier and the URL forms it accepts, parsed once at start-up.

URL forms (one server, or any reachable subset of a Cluster's nodes)::

    redis://[user[:password]@]host[:port][/db]
    rediss://...                                  TLS
    redis+cluster://[user[:password]@]host:port[,host:port...]
    rediss+cluster://...                          Cluster over TLS

Credentials may come from the URL or from ``username``/``password`` (which win). They are
kept out of every repr, log line and exception: ``ServerUrl.redacted`` is the only form of
the URL that kvtier ever prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from kvtier.errors import ConfigError

DEFAULT_PORT = 6379
_SCHEMES = {
    "redis": (False, False),
    "rediss": (True, False),
    "redis+cluster": (False, True),
    "rediss+cluster": (True, True),
}


@dataclass(frozen=True)
class ServerUrl:
    """A parsed ``url`` option, credentials apart."""

    #: (host, port) of every node named; one for a standalone server.
    hosts: tuple[tuple[str, int], ...]
    #: True for rediss:// forms.
    tls: bool
    #: True for the +cluster forms.
    cluster: bool
    #: Database number (standalone only; Cluster has only db 0).
    db: int = 0
    #: User name from the URL, if any (ACL user; not secret, but kept out of repr anyway).
    username: str | None = field(default=None, repr=False)
    #: Password from the URL, if any.
    password: str | None = field(default=None, repr=False)

    @property
    def redacted(self) -> str:
        """The URL without credentials: safe for logs and error messages."""
        scheme = ("rediss" if self.tls else "redis") + ("+cluster" if self.cluster else "")
        nodes = ",".join(f"{h}:{p}" for h, p in self.hosts)
        return f"{scheme}://{nodes}" + (f"/{self.db}" if self.db else "")


def parse_url(url: str) -> ServerUrl:
    """Parse ``url``; raise ``ConfigError`` naming the option and the accepted forms."""

    def bad(why: str) -> ConfigError:
        # Never echo the URL itself: it may carry a password.
        return ConfigError(
            f"shared tier: url option {why}; use redis://host:port, rediss://host:port or "
            "redis+cluster://host:port,host:port (credentials in username/password)"
        )

    if not isinstance(url, str) or "://" not in url:
        raise bad("is not a URL")
    scheme, rest = url.split("://", 1)
    if scheme.lower() not in _SCHEMES:
        raise bad(f"has scheme {scheme!r:.20}, not one of {sorted(_SCHEMES)}")
    tls, cluster = _SCHEMES[scheme.lower()]
    userinfo, _, hostpart = rest.rpartition("@")
    username = password = None
    if userinfo:
        user, sep, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    hostpart, _, path = hostpart.partition("/")
    if "?" in path or "?" in hostpart:
        raise bad("has query parameters; pass options as keyword arguments")
    hosts: list[tuple[str, int]] = []
    for item in hostpart.split(","):
        parsed = urlsplit(f"//{item}")
        try:
            port = parsed.port or DEFAULT_PORT
        except ValueError:
            raise bad("has a port that is not a number in 1..65535") from None
        if not parsed.hostname:
            raise bad("names no host")
        hosts.append((parsed.hostname, port))
    if len(hosts) > 1 and not cluster:
        raise bad("names several hosts without the +cluster scheme")
    db = 0
    if path:
        if cluster or not path.isdigit():
            raise bad("has a path that is not a database number (Cluster has only db 0)")
        db = int(path)
    return ServerUrl(tuple(hosts), tls, cluster, db, username, password)


@dataclass(frozen=True)
class SharedStoreConfig:
    """Everything ``SharedStore`` needs besides the namespace; secrets are ``repr=False``."""

    #: Server or Cluster URL (see the module docstring); credentials in it never get printed.
    url: str = field(repr=False)
    #: Seconds to wait for a TCP (and TLS) connection.
    connect_timeout_s: float = 0.5
    #: Seconds to wait for any one reply; a 6 MiB GET takes ~4 ms on loopback.
    op_timeout_s: float = 2.0
    #: Retries after a connection error or timeout before the operation misses (0..3).
    retries: int = 1
    #: ACL user name; overrides the URL's.
    username: str | None = field(default=None, repr=False)
    #: Password (requirepass or the ACL user's); overrides the URL's.
    password: str | None = field(default=None, repr=False)
    #: CA bundle that signed the server's certificate (rediss:// only).
    tls_ca_file: str | None = None
    #: Client certificate, for servers with ``tls-auth-clients yes``.
    tls_cert_file: str | None = None
    #: Key of ``tls_cert_file``.
    tls_key_file: str | None = field(default=None, repr=False)
    #: Largest record (header + payload) put will send; None: 1/8 of the smallest maxmemory.
    max_record_bytes: int | None = None
    #: First circuit-breaker back-off after a server fault, seconds; doubles per failed probe.
    breaker_base_s: float = 0.5
    #: Longest back-off, seconds.
    breaker_max_s: float = 30.0
    #: Most keys kept in the in-memory view that answers ``contains`` (LRU beyond that);
    #: ~200 bytes of process memory each.
    view_max_keys: int = 262_144

    def __post_init__(self) -> None:
        checks = [
            ("connect_timeout_s", self.connect_timeout_s > 0, "a positive number such as 0.5"),
            ("op_timeout_s", self.op_timeout_s > 0, "a positive number such as 2"),
            ("retries", 0 <= self.retries <= 3, "0..3 (each retry can cost op_timeout_s)"),
            ("breaker_base_s", self.breaker_base_s > 0, "a positive number such as 0.5"),
            ("breaker_max_s", self.breaker_max_s >= self.breaker_base_s, ">= breaker_base_s"),
            ("view_max_keys", self.view_max_keys > 0, "a positive count such as 262144"),
            (
                "max_record_bytes",
                self.max_record_bytes is None or self.max_record_bytes > 0,
                "a positive byte count or None",
            ),
        ]
        for name, ok, fix in checks:
            if not ok:
                raise ConfigError(f"shared tier: {name}={getattr(self, name)!r}; give {fix}")
        server = self.server
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError(
                "shared tier: tls_cert_file and tls_key_file go together; give both or neither"
            )
        if not server.tls and (self.tls_ca_file or self.tls_cert_file):
            raise ConfigError(
                f"shared tier: TLS files given but url={server.redacted} is not TLS; "
                "use rediss:// (or rediss+cluster://)"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SharedStoreConfig:
        """Build from a plain mapping (e.g. ``kv_connector_extra_config``); unknown keys are a
        ``ConfigError`` listing the known ones, so a misspelt option never passes silently."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(f"shared tier: unknown options {unknown}; known: {known}")
        if "url" not in options:
            raise ConfigError("shared tier: no url option; give e.g. redis://127.0.0.1:6379")
        return cls(**options)

    @property
    def server(self) -> ServerUrl:
        """The parsed ``url``."""
        return parse_url(self.url)

    @property
    def effective_username(self) -> str | None:
        return self.username if self.username is not None else self.server.username

    @property
    def effective_password(self) -> str | None:
        return self.password if self.password is not None else self.server.password

    def __repr__(self) -> str:
        return (
            f"SharedStoreConfig(url={self.server.redacted!r}, "
            f"connect_timeout_s={self.connect_timeout_s}, op_timeout_s={self.op_timeout_s}, "
            f"retries={self.retries}, auth={'yes' if self.effective_password else 'no'}, "
            f"tls_ca_file={self.tls_ca_file!r}, max_record_bytes={self.max_record_bytes})"
        )
