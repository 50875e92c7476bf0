"""Namespace identity: stable digest, JSON round trip, strict parsing."""

from __future__ import annotations

import dataclasses

import pytest

from kvtier.errors import ConfigError
from kvtier.format import Namespace
from tests.support.store import make_namespace


def test_digest_is_stable_across_versions_of_the_code() -> None:
    # Pinned: changing it orphans every stored block. Change only with FORMAT_VERSION.
    assert make_namespace().digest_hex() == "6b1d1107ea5fc8da13e238f81b4f90fc"


@pytest.mark.parametrize(
    "change",
    [
        {"model": "m2"},
        {"weights_fingerprint": "x"},
        {"kv_dtype": "bfloat16"},
        {"block_size_tokens": 32},
        {"num_groups": 2},
        {"num_layers": 3},
        {"num_kv_heads": 4},
        {"head_size": 128},
        {"block_bytes": 4096},
        {"hash_algorithm": "xxhash"},
        {"format_version": 2},
        {"extra": {"vllm": "0.32.0"}},
    ],
)
def test_every_field_changes_the_digest(change: dict[str, object]) -> None:
    base = make_namespace()
    assert dataclasses.replace(base, **change).digest() != base.digest()


def test_extra_order_does_not_matter_and_is_read_only() -> None:
    a = dataclasses.replace(make_namespace(), extra={"a": "1", "b": "2"})
    b = dataclasses.replace(make_namespace(), extra={"b": "2", "a": "1"})
    assert a == b and a.digest() == b.digest() and hash(a) == hash(b)
    with pytest.raises(TypeError):
        a.extra["c"] = "3"  # type: ignore[index]


def test_json_round_trip() -> None:
    ns = dataclasses.replace(make_namespace(), extra={"engine": "vllm"})
    assert Namespace.from_json(ns.to_json()) == ns


def test_unknown_json_field_is_refused_with_the_known_ones() -> None:
    text = make_namespace().to_json().replace('"model"', '"modle"')
    with pytest.raises(ConfigError, match="unknown fields \\['modle'\\]; known: "):
        Namespace.from_json(text)


def test_edited_json_with_stale_digest_is_refused() -> None:
    text = make_namespace().to_json().replace('"float32"', '"float16"')
    with pytest.raises(ConfigError, match="does not match its fields"):
        Namespace.from_json(text)


@pytest.mark.parametrize("change", [{"num_layers": "2"}, {"block_bytes": 0}, {"head_size": -1}])
def test_invalid_fields_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="namespace: "):
        dataclasses.replace(make_namespace(), **change)
