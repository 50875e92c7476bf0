"""``KVTIER_*`` environment variables: validated when first needed, errors name the fix."""

import importlib

import pytest

from kvtier.env import KvtierEnv, read_env
from kvtier.errors import ConfigError
from kvtier.hostpool import regions


def test_unset_variables_give_the_defaults():
    assert read_env({}) == KvtierEnv()
    assert read_env({}).log_level == "INFO" and read_env({}).shm_min_age_s == 30


def test_an_empty_variable_counts_as_unset():
    assert read_env({"KVTIER_LOG_LEVEL": "", "KVTIER_SHM_MIN_AGE_S": " "}) == KvtierEnv()


def test_a_log_level_in_any_case_is_accepted():
    assert read_env({"KVTIER_LOG_LEVEL": "debug"}).log_level == "DEBUG"


@pytest.mark.parametrize(
    ("environ", "match"),
    [
        (
            {"KVTIER_LOG_LEVEL": "loud"},
            r"^kvtier: KVTIER_LOG_LEVEL='loud': .*; "
            r"use one of DEBUG, INFO, WARNING, ERROR, CRITICAL$",
        ),
        (
            {"KVTIER_SHM_MIN_AGE_S": "soon"},
            r"KVTIER_SHM_MIN_AGE_S='soon': .*number; give seconds >= 0",
        ),
        ({"KVTIER_SHM_MIN_AGE_S": "-1"}, r"KVTIER_SHM_MIN_AGE_S='-1': .*; give seconds >= 0"),
        ({"KVTIER_SHM_MIN_AGE_S": "nan"}, r"KVTIER_SHM_MIN_AGE_S='nan'"),
    ],
)
def test_a_bad_variable_names_itself_its_value_and_the_fix(environ, match):
    with pytest.raises(ConfigError, match=match):
        read_env(environ)


def test_every_bad_variable_is_named_at_once():
    with pytest.raises(ConfigError, match=r"KVTIER_LOG_LEVEL.*KVTIER_SHM_MIN_AGE_S"):
        read_env({"KVTIER_LOG_LEVEL": "x", "KVTIER_SHM_MIN_AGE_S": "y"})


def test_the_shared_password_is_kept_secret():
    env = read_env({"KVTIER_SHARED_PASSWORD": "pw-9e1"})
    assert env.shared_password is not None
    assert env.shared_password.get_secret_value() == "pw-9e1"
    assert "pw-9e1" not in repr(env) and "pw-9e1" not in str(env)


def test_variables_are_read_when_needed_not_at_import(monkeypatch, tmp_path):
    monkeypatch.setenv("KVTIER_SHM_MIN_AGE_S", "soon")
    importlib.reload(regions)  # importing never reads it
    with pytest.raises(ConfigError, match="KVTIER_SHM_MIN_AGE_S='soon'"):
        regions.clean_stale_regions(tmp_path)
    stale = tmp_path / "vllm_offload_dead.mmap"
    stale.write_bytes(b"\0")
    monkeypatch.setenv("KVTIER_SHM_MIN_AGE_S", "0")
    assert regions.clean_stale_regions(tmp_path) == [stale], "the value in force is used"
