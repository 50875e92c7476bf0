"""kvtier's environment variables: one model, read when first needed, never at import.

Each ``KVTIER_*`` variable is a field of ``KvtierEnv``; ``read_env`` validates all of them
from ``os.environ`` (or a given mapping) and raises ``ConfigError`` naming the variable, its
value and the fix, e.g. ``kvtier: KVTIER_LOG_LEVEL='loud': ...; use one of DEBUG, INFO, ...``.
The engine reads them while it starts (the spec's and tiers' constructors), so a bad value
refuses start-up instead of surfacing later. An empty variable counts as unset
(``VAR= cmd`` is how shells clear one).

The lab's own variables (``KVTIER_REDIS_SERVER``, ``KVTIER_REPORT_DIR``) belong to its tools,
not to the library, and are read there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from kvtier.errors import ConfigError

PREFIX = "KVTIER_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class KvtierEnv(BaseModel):
    """The ``KVTIER_*`` variables, typed (field ``log_level`` is ``KVTIER_LOG_LEVEL``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    #: Level of kvtier's log records in engine processes.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        default="INFO", json_schema_extra={"fix": f"use one of {', '.join(LOG_LEVELS)}"}
    )
    #: A host-pool region file in /dev/shm younger than this (seconds) is never removed as
    #: stale, even with no holder visible (its creator may be in another PID namespace).
    shm_min_age_s: float = Field(
        default=30.0, ge=0, json_schema_extra={"fix": "give seconds >= 0, e.g. 30 (0 in tests)"}
    )
    #: The shared tier's password, read in the engine's processes so it stays off command
    #: lines; a ``password`` in the tier's settings wins.
    shared_password: SecretStr | None = Field(
        default=None, json_schema_extra={"fix": "give the shared server's password"}
    )
    #: Master keys of encryption at rest (64 hex digits each, comma-separated, the first
    #: sealing new records), read in the engine's processes when ``encryption_key_env`` is on.
    master_key: SecretStr | None = Field(
        default=None,
        json_schema_extra={"fix": "give 64 hex digits per key, e.g. from `openssl rand -hex 32`"},
    )
    #: Root of kvtier's caches (models fetched by its tools); unset: ~/.cache/kvtier.
    cache_dir: Path | None = Field(
        default=None, json_schema_extra={"fix": "give a folder, or unset it"}
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("shm_min_age_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("not a finite number")
        return value


def variable(field: str) -> str:
    """The environment variable of a ``KvtierEnv`` field."""
    return PREFIX + field.upper()


def read_env(environ: Mapping[str, str] | None = None) -> KvtierEnv:
    """``KvtierEnv`` from ``environ`` (default ``os.environ``); ``ConfigError`` if one is bad."""
    environ = os.environ if environ is None else environ
    data = {
        name: environ[variable(name)]
        for name in KvtierEnv.model_fields
        if environ.get(variable(name), "").strip()
    }
    try:
        return KvtierEnv.model_validate(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_url=False):
            name = str(error["loc"][0])
            extra = KvtierEnv.model_fields[name].json_schema_extra
            fix = extra.get("fix") if isinstance(extra, dict) else None
            hidden = name in ("shared_password", "master_key")
            shown = "<hidden>" if hidden else repr(data.get(name))
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"{variable(name)}={shown}: {message}" + (f"; {fix}" if fix else ""))
        raise ConfigError("kvtier: " + "; ".join(lines)) from None
