"""The URL forms the shared tier accepts: the one parser, and the one redacted form.

URL forms (one server, or any reachable subset of a Cluster's nodes)::

    redis://[user[:password]@]host[:port][/db]
    rediss://...                                  TLS
    redis+cluster://[user[:password]@]host:port[,host:port...]
    rediss+cluster://...                          Cluster over TLS

``kvtier.settings.SharedTierSettings`` moves credentials out of the URL into its
``username``/``password`` fields when it parses one, so the URL it keeps is ``ServerUrl.redacted``:
the only form of a server URL kvtier ever prints. Imports neither vLLM nor redis-py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from kvtier.errors import ConfigError

DEFAULT_PORT = 6379
_SCHEMES = {
    "redis": (False, False),
    "rediss": (True, False),
    "redis+cluster": (False, True),
    "rediss+cluster": (True, True),
}
#: The accepted forms, for error messages.
URL_FORMS = (
    "redis://HOST:PORT, rediss://HOST:PORT (TLS) or redis+cluster://HOST:PORT[,HOST:PORT...]"
)


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


def split_url(url: str) -> ServerUrl:
    """Parse ``url``; a bad one raises ``ValueError`` saying what is wrong, never echoing it
    (it may carry a password)."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError("is not a URL")
    scheme, rest = url.split("://", 1)
    if scheme.lower() not in _SCHEMES:
        raise ValueError(f"has scheme {scheme!r:.20}, not one of {sorted(_SCHEMES)}")
    tls, cluster = _SCHEMES[scheme.lower()]
    userinfo, _, hostpart = rest.rpartition("@")
    username = password = None
    if userinfo:
        user, sep, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    hostpart, _, path = hostpart.partition("/")
    if "?" in path or "?" in hostpart:
        raise ValueError("has query parameters; give the shared tier's options instead")
    hosts: list[tuple[str, int]] = []
    for item in hostpart.split(","):
        parsed = urlsplit(f"//{item}")
        try:
            port = parsed.port or DEFAULT_PORT
        except ValueError:
            raise ValueError("has a port that is not a number in 1..65535") from None
        if not parsed.hostname:
            raise ValueError("names no host")
        hosts.append((parsed.hostname, port))
    if len(hosts) > 1 and not cluster:
        raise ValueError("names several hosts without the +cluster scheme")
    db = 0
    if path:
        if cluster or not path.isdigit():
            raise ValueError("has a path that is not a database number (Cluster has only db 0)")
        db = int(path)
    return ServerUrl(tuple(hosts), tls, cluster, db, username, password)


def parse_url(url: str) -> ServerUrl:
    """``split_url`` for direct callers: ``ConfigError`` naming the option and the forms."""
    try:
        return split_url(url)
    except ValueError as exc:
        raise ConfigError(
            f"shared tier: url option {exc}; use {URL_FORMS} (credentials in username/password)"
        ) from None
