"""URL forms and options of the shared tier; credentials never show in repr or errors."""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.store.shared import SharedStoreConfig, parse_url


def test_standalone_url_with_credentials_and_db() -> None:
    url = parse_url("redis://alice:s%40cret@cache.internal:7000/2")
    assert url.hosts == (("cache.internal", 7000),)
    assert (url.tls, url.cluster, url.db) == (False, False, 2)
    assert (url.username, url.password) == ("alice", "s@cret")


def test_tls_url_defaults_the_port() -> None:
    url = parse_url("rediss://cache")
    assert url.hosts == (("cache", 6379),) and url.tls


def test_cluster_url_lists_every_node() -> None:
    url = parse_url("rediss+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001")
    assert url.hosts == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    assert url.cluster and url.tls and url.password == "pw"
    assert url.redacted == "rediss+cluster://10.0.0.1:7000,10.0.0.2:7001"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("localhost:6379", "is not a URL"),
        ("http://h:1", "has scheme"),
        ("redis://a:1,b:2", "several hosts without the \\+cluster"),
        ("redis+cluster://a:1/3", "not a database number"),
        ("redis://a:99999", "port"),
        ("redis://a:1?db=2", "query parameters"),
    ],
)
def test_bad_url_names_the_option_and_the_forms(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"url option .*{why}.*redis\\+cluster://"):
        parse_url(url)


def test_bad_url_error_never_echoes_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        parse_url("redis://u:hunter2-secret@host:notaport")
    assert "hunter2-secret" not in str(info.value)


def test_config_repr_hides_every_secret() -> None:
    config = SharedStoreConfig(
        url="rediss://kvuser:url-secret@h:1",
        password="option-secret",
        tls_ca_file="/ca.pem",
        tls_cert_file="/c.pem",
        tls_key_file="/k.pem",
    )
    text = repr(config)
    assert "url-secret" not in text and "option-secret" not in text and "kvuser" not in text
    assert "rediss://h:1" in text and "auth=yes" in text
    assert config.effective_password == "option-secret"


@pytest.mark.parametrize(
    ("option", "value"),
    [("op_timeout_s", 0), ("connect_timeout_s", -1), ("retries", 9), ("max_record_bytes", 0)],
)
def test_invalid_option_names_itself(option: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{option}={value}"):
        SharedStoreConfig(url="redis://h", **{option: value})  # type: ignore[arg-type]


def test_tls_files_without_tls_url_are_refused() -> None:
    with pytest.raises(ConfigError, match="use rediss://"):
        SharedStoreConfig(url="redis://h", tls_ca_file="/ca.pem")


def test_unknown_option_is_refused_with_the_known_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown options \['op_timeout'\]; known: .*op_timeout_s"
    ):
        SharedStoreConfig.from_options({"url": "redis://h", "op_timeout": 2})


def test_options_mapping_without_url_names_it() -> None:
    with pytest.raises(ConfigError, match="no url option"):
        SharedStoreConfig.from_options({"op_timeout_s": 2})
