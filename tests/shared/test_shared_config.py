"""URL forms and options of the shared tier; credentials never show in repr or errors.

The store's options are ``SharedTierSettings``, the model the vLLM tier parses too.
"""

from __future__ import annotations

import pytest

from kvtier.errors import ConfigError
from kvtier.settings import SharedTierSettings
from kvtier.store.shared import SharedStore, parse_url
from tests.support.store import make_namespace


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


def test_settings_repr_hides_every_secret() -> None:
    settings = SharedTierSettings.parse(
        {
            "url": "rediss://kvuser:url-secret@h:1",
            "password": "option-secret",
            "tls_ca_file": "/ca.pem",
            "tls_cert_file": "/c.pem",
            "tls_key_file": "/k.pem",
        }
    )
    text = repr(settings) + str(settings)
    assert "url-secret" not in text and "option-secret" not in text and "/k.pem" not in text
    assert settings.url == "rediss://h:1", "credentials leave the URL when it is parsed"
    assert settings.username == "kvuser", "the URL's user is kept"
    assert settings.password_text == "option-secret", "the password option wins over the URL's"


def test_the_urls_password_is_used_when_no_option_gives_one() -> None:
    settings = SharedTierSettings.parse({"url": "redis://:url-secret@h:1/3"})
    assert settings.password_text == "url-secret" and settings.username is None
    assert settings.url == "redis://h:1/3" and settings.server.db == 3
    assert SharedTierSettings.parse(settings.to_dict()) == settings


@pytest.mark.parametrize(
    ("option", "value"),
    [("op_timeout_s", 0), ("connect_timeout_s", -1), ("retries", 9), ("max_record_bytes", 0)],
)
def test_invalid_option_names_itself(option: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{option} .*={value}"):
        SharedTierSettings.parse({"url": "redis://h", option: value})


def test_tls_files_without_tls_url_are_refused() -> None:
    with pytest.raises(ConfigError, match="use rediss://"):
        SharedTierSettings.parse({"url": "redis://h", "tls_ca_file": "/ca.pem"})


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(ConfigError, match="shared_tls_cert_file and shared_tls_key_file go"):
        SharedTierSettings.parse({"url": "rediss://h", "tls_cert_file": "/c.pem"})


def test_breaker_back_off_cannot_shrink() -> None:
    with pytest.raises(ConfigError, match=r"shared_breaker_max_s=1.0 is below"):
        SharedTierSettings.parse({"url": "redis://h", "breaker_base_s": 2, "breaker_max_s": 1})


def test_a_bad_url_in_the_settings_is_never_echoed() -> None:
    hidden = r"url \(shared / --shared\)=<hidden>: has a port"
    with pytest.raises(ConfigError, match=hidden) as info:
        SharedTierSettings.parse({"url": "redis://u:hunter2-secret@host:notaport"})
    assert "hunter2-secret" not in str(info.value)


def test_unknown_option_is_refused_with_the_known_ones() -> None:
    unknown = r"unknown shared tier option\(s\) \['op_timeout'\]; known: .*op_timeout_s"
    with pytest.raises(ConfigError, match=unknown):
        SharedStore.from_options({"url": "redis://h", "op_timeout": 2}, make_namespace())


def test_options_mapping_without_url_names_it() -> None:
    with pytest.raises(ConfigError, match=r"url \(shared / --shared\)=.*Field required"):
        SharedStore.from_options({"op_timeout_s": 2}, make_namespace())


def test_the_store_takes_the_settings_model_only() -> None:
    with pytest.raises(TypeError, match=r"SharedTierSettings\.parse"):
        SharedStore("redis://h", make_namespace())  # type: ignore[arg-type]
