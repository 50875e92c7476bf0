"""Passwords, ACL users and TLS; no secret ever reaches repr, logs or exceptions."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.store.base import FixedClaim
from tests.support.redis_servers import RedisServer
from tests.support.shared_store import open_shared
from tests.support.store import key_of, make_namespace, payload_of

PASSWORD = "pw-7f3a9c-not-in-logs"
ACL_PASSWORD = "acl-2b8e41-not-in-logs"
# Redis 7.0 refuses to start on unknown commands in a rule (no +client|setinfo before 7.2).
ACL_RULE = (
    f"kvtier on >{ACL_PASSWORD} ~kvt:* resetchannels -@all "
    "+get +set +del +strlen +scan +ping +hello +auth"
)


def assert_secret_absent(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


def test_requirepass_without_password_is_a_config_error_naming_the_options(
    fresh_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_server(extra_args=["--requirepass", PASSWORD])
    with pytest.raises(ConfigError, match="username/password") as info:
        open_shared(server.url, make_namespace())
    with pytest.raises(ConfigError, match="username/password") as wrong:
        open_shared(server.url, make_namespace(), password=PASSWORD + "x")
    assert_secret_absent(PASSWORD, str(info.value), str(wrong.value), caplog.text)


def test_password_works_and_stays_out_of_repr_and_logs(
    fresh_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_server(extra_args=["--requirepass", PASSWORD])
    with caplog.at_level(logging.DEBUG, logger="kvtier"):
        store = open_shared(server.url, make_namespace(), password=PASSWORD)
        with store:
            assert store.put(key_of(1), payload_of(1))
            assert store.get(key_of(1)) == payload_of(1)
            server.kill()
            assert store.get(key_of(1)) is None  # fault logs must not leak it either
            texts = [repr(store), repr(store.config), str(store.stats())]
    assert_secret_absent(PASSWORD, *texts, caplog.text)
    assert "password=SecretStr('**********')" in repr(store.config)


def test_acl_user_limited_to_the_prefix_works_without_config_permission(
    fresh_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_server(extra_args=["--user", *ACL_RULE.split()])
    url = f"redis://kvtier:{ACL_PASSWORD}@127.0.0.1:{server.port}"
    with caplog.at_level(logging.INFO, logger="kvtier"):
        store = open_shared(url, make_namespace(), max_record_bytes=2**20)
    with store:
        assert store.put(key_of(1), payload_of(1))
        assert store.get(key_of(1)) == payload_of(1)
        assert store.exists_many([key_of(1), key_of(2)]) == {key_of(1)}
        assert store.verify() == []
        assert_secret_absent(ACL_PASSWORD, repr(store), repr(store.config))
    assert "cannot read the server's settings" in caplog.text  # CONFIG is not permitted
    assert_secret_absent(ACL_PASSWORD, caplog.text)


def _make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 signed by it."""
    folder.mkdir()
    names = ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem")
    ca_key, ca, key, csr, cert = (folder / n for n in names)
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    commands = [
        ["openssl", "req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", ca_key,
         "-out", ca, "-days", "2", "-subj", "/CN=kvtier-test-ca"],
        ["openssl", "req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", key, "-out", csr,
         "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "2", "-extfile", ext],
    ]  # fmt: skip
    for command in commands:
        subprocess.run([str(c) for c in command], check=True, capture_output=True, timeout=60)
    return ca, cert, key


@pytest.fixture
def tls_server(
    fresh_server: Callable[..., RedisServer], tmp_path: Path
) -> tuple[RedisServer, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test certificate")
    ca, cert, key = _make_certs(tmp_path / "certs")
    tls_args = ["--tls-cert-file", str(cert), "--tls-key-file", str(key),
                "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]  # fmt: skip
    try:
        server = fresh_server(tls_args=tls_args)
    except RuntimeError as exc:  # the wheels' Valkey and Redis 6.2 builds have no TLS
        said = str(exc).strip().splitlines()[-1].split(" # ")[-1]  # the log's last word
        if said.endswith(":"):  # no log: it refused the options before opening one
            said = "it exited at start-up with the TLS options"
        pytest.skip(f"this server build cannot run TLS ({said})")
    return server, ca


def test_tls_with_the_ca_round_trips(tls_server: tuple[RedisServer, Path]) -> None:
    server, ca = tls_server
    assert server.url.startswith("rediss://")
    with open_shared(server.url, make_namespace(), tls_ca_file=str(ca)) as store:
        assert store.put(key_of(1), payload_of(1))
        assert store.get(key_of(1)) == payload_of(1)


def test_tls_load_of_a_multi_mib_record_is_read_directly_through_the_ssl_socket(
    tls_server: tuple[RedisServer, Path],
) -> None:
    server, ca = tls_server
    payload_len = 3 * 2**20 + 12_345  # ~200 TLS records, an odd tail
    namespace = make_namespace(block_bytes=payload_len)
    with open_shared(server.url, namespace, tls_ca_file=str(ca)) as store:
        assert store.put(key_of(1), payload_of(1, payload_len))
        out, bounce = bytearray(payload_len), memoryview(bytearray(payload_len))
        assert store.get_into_when(key_of(1), memoryview(out), FixedClaim(), bounce)
        assert out == payload_of(1, payload_len)
        assert store.get_into(key_of(1), memoryview(out)) and out == payload_of(1, payload_len)
        assert not store.get_into_when(key_of(2), memoryview(out), FixedClaim(), bounce)
        stats = store.stats()
        assert stats.direct_hits == 2 and stats.misses == 1 and stats.errors == {}


def test_tls_without_the_ca_is_a_config_error_naming_the_tls_options(
    tls_server: tuple[RedisServer, Path],
) -> None:
    server, _ = tls_server
    with pytest.raises(ConfigError, match="tls_ca_file"):
        open_shared(server.url, make_namespace())


def test_plain_client_against_tls_port_is_a_config_error(
    tls_server: tuple[RedisServer, Path],
) -> None:
    server, _ = tls_server
    with pytest.raises(ConfigError, match=f"url=redis://127.0.0.1:{server.port}"):
        open_shared(f"redis://127.0.0.1:{server.port}", make_namespace(), connect_timeout_s=0.3)


def test_the_password_variable_opens_a_server_that_requires_one(
    fresh_server: Callable[..., RedisServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The engine's path: settings without a password, KVTIER_SHARED_PASSWORD in its env."""
    from kvtier.settings import SharedTierSettings
    from kvtier.vllm.shared_tier import open_shared_store

    server = fresh_server(extra_args=["--requirepass", PASSWORD])
    settings = SharedTierSettings.parse({"url": server.url})
    monkeypatch.setenv("KVTIER_SHARED_PASSWORD", PASSWORD + "x")
    with pytest.raises(ConfigError, match="username/password") as wrong:
        open_shared_store(settings, make_namespace(), None)
    monkeypatch.setenv("KVTIER_SHARED_PASSWORD", PASSWORD)
    with (
        caplog.at_level(logging.DEBUG, logger="kvtier"),
        open_shared_store(settings, make_namespace(), None) as store,
    ):
        assert store.put(key_of(1), payload_of(1))
        assert store.get(key_of(1)) == payload_of(1)
    assert_secret_absent(PASSWORD, str(wrong.value), caplog.text, repr(settings))
