"""kvtier's typed settings: one frozen model per component, parsed and validated here only.

``kvtier.kv_transfer_config`` builds these models from the user's options and serialises them
into vLLM's ``kv_transfer_config`` dict; the CPU spec and each tier parse their part back with
the same models (``parse``), so a value is checked by one piece of code wherever it comes from
(Python, ``kvtier serve``, or a hand-written ``--kv-transfer-config`` JSON).

Where each part lives in vLLM's dict::

    kv_connector_extra_config = {
        "spec_name": "KvtierCpuSpec", "spec_module_path": "kvtier.vllm.spec",
        "cpu_bytes_to_use": <HostPoolSettings.host_pool_bytes>,   # upstream's key
        "kvtier": {<HostPoolSettings without host_pool_bytes>},
        "secondary_tiers": [{"type": "KvtierDiskTier", "module_path": ..., <DiskTierSettings>}],
        <upstream pass-through options>,
    }

Every size field is in bytes and named ``*_bytes``, every duration ``*_s``; sizes also accept
strings such as ``"64GiB"``. Unknown keys are refused with the list of known ones. An invalid
value raises ``ConfigError`` naming the field, the user-facing option and the fix.

This module imports neither vLLM nor the storage core.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

from kvtier.errors import ConfigError
from kvtier.units import parse_size

SPEC_NAME = "KvtierCpuSpec"
SPEC_MODULE = "kvtier.vllm.spec"
#: The key of kvtier's own options inside ``kv_connector_extra_config``.
SPEC_OPTIONS_KEY = "kvtier"
DISK_TIER_TYPE = "KvtierDiskTier"
DISK_TIER_MODULE = "kvtier.vllm.disk_tier"
SHARED_TIER_TYPE = "KvtierSharedTier"
SHARED_TIER_MODULE = "kvtier.vllm.shared_tier"
#: Keys vLLM's ``SecondaryTierFactory`` reads itself from a tier's dict; not ours to check.
FACTORY_KEYS = frozenset({"type", "module_path", "locality", "backpressure"})


def _to_bytes(value: Any) -> Any:
    """Sizes as people write them (``"4GiB"``) become ints; other types go to pydantic."""
    if isinstance(value, bool):
        raise ValueError("not a size; give bytes or a size such as '4GiB'")
    if isinstance(value, str | int):
        try:
            return parse_size(value)
        except ConfigError as exc:
            detail = str(exc)
            raise ValueError(detail[detail.find("not a size") :] or detail) from None
    return value


def _to_absolute(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str | Path) or not str(value):
        raise ValueError("give a folder path")
    return Path(value).expanduser().absolute()


Bytes = Annotated[int, BeforeValidator(_to_bytes)]
AbsolutePath = Annotated[Path, BeforeValidator(_to_absolute)]


def _option(name: str, fix: str) -> dict[str, Any]:
    """Field metadata: the user-facing option (Python / CLI) and how to fix a bad value."""
    return {"json_schema_extra": {"option": name, "fix": fix}}


class _Settings(BaseModel):
    """Frozen, strict about unknown keys; ``parse`` turns validation errors into ConfigError."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
    #: Name of the component in error messages.
    component: ClassVar[str] = "kvtier"

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Self:
        """Validate ``data``; raise ``ConfigError`` naming every bad field and its fix."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"kvtier: {cls.component} settings must be a mapping, not {data!r}")
        known = sorted(cls.model_fields)
        unknown = sorted(str(k) for k in data if k not in cls.model_fields)
        if unknown:
            raise ConfigError(
                f"kvtier: unknown {cls.component} option(s) {unknown}; known: {known}"
            )
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(cls._explain(exc)) from None

    @classmethod
    def _explain(cls, exc: ValidationError) -> str:
        lines = []
        for error in exc.errors(include_url=False):
            field = str(error["loc"][0]) if error["loc"] else ""
            info = cls.model_fields.get(field)
            extra = (info.json_schema_extra if info is not None else None) or {}
            option = extra.get("option") if isinstance(extra, dict) else None
            fix = extra.get("fix") if isinstance(extra, dict) else None
            shown = "<hidden>" if "password" in field else repr(error.get("input"))
            where = f"{field} ({option})" if option else field
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"{where}={shown}: {message}" + (f"; {fix}" if fix else ""))
        return f"kvtier: invalid {cls.component} option: " + "; ".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict that ``parse`` reads back to an equal object (secrets included)."""
        out = self.model_dump(mode="json")
        for name, value in self:
            if isinstance(value, SecretStr):
                out[name] = value.get_secret_value()
            elif isinstance(value, _Settings):
                out[name] = value.to_dict()
        return out


class HostPoolSettings(_Settings):
    """The CPU spec: host-RAM pool (the first tier after the engine's own KV cache)."""

    component: ClassVar[str] = "host pool"

    host_pool_bytes: Bytes = Field(
        default=2 * 2**30,
        gt=0,
        **_option("host_pool / --host-pool", "give the host pool a size such as '4GiB'"),
    )
    host_pool_dir: AbsolutePath | None = Field(
        default=None,
        **_option(
            "host_pool_dir / --host-pool-dir",
            "give a folder on a local disk, such as '/var/cache/kvtier/pool', or leave it unset",
        ),
    )
    allow_small_tiers: bool = Field(
        default=False,
        strict=True,
        **_option("allow_small_tiers / --allow-small-tiers", "give true or false"),
    )
    restore_decision: bool = Field(
        default=True,
        strict=True,
        **_option(
            "restore_decision / --no-restore-decision",
            "give true (restore a hit only when faster than recomputing it) or false",
        ),
    )

    def to_extra_config(self) -> dict[str, Any]:
        """The spec's keys in ``kv_connector_extra_config``."""
        options = self.to_dict()
        pool_bytes = options.pop("host_pool_bytes")
        return {"cpu_bytes_to_use": pool_bytes, SPEC_OPTIONS_KEY: options}

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> HostPoolSettings:
        """Parse the spec's part of ``kv_connector_extra_config`` (see the module docstring)."""
        stray = sorted(k for k in extra if isinstance(k, str) and k.startswith("kvtier_"))
        if stray:
            raise ConfigError(
                f"kvtier: unknown option(s) {stray} in kv_connector_extra_config; kvtier's "
                f"options go under the '{SPEC_OPTIONS_KEY}' key (build the dict with "
                "kvtier.kv_transfer_config())"
            )
        options = extra.get(SPEC_OPTIONS_KEY) or {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"kvtier: kv_connector_extra_config['{SPEC_OPTIONS_KEY}']={options!r}; "
                "give a mapping (build the dict with kvtier.kv_transfer_config())"
            )
        data = dict(options)
        if "cpu_bytes_to_use" in extra:
            data["host_pool_bytes"] = extra["cpu_bytes_to_use"]
        return cls.parse(data)


class DiskTierSettings(_Settings):
    """kvtier's disk tier (``KvtierDiskTier``): verified, bounded, crash-safe records."""

    component: ClassVar[str] = "disk tier"

    root_dir: AbsolutePath = Field(
        **_option("disk_dir / --disk-dir", "give the disk tier's folder, e.g. /var/cache/kvtier")
    )
    capacity_bytes: Bytes | None = Field(
        default=None,
        gt=4096,
        **_option(
            "disk_capacity / --disk-capacity",
            "give a size such as '64GiB', or leave it unset to keep the folder's cap "
            "(a new folder gets a quarter of its file system, at most 256 GiB)",
        ),
    )
    free_space_floor_bytes: Bytes | None = Field(
        default=None,
        **_option(
            "free_space_floor_bytes",
            "give a size such as '10GiB', or leave it unset (5 % of the file system, <= 10 GiB)",
        ),
    )
    io_threads: int = Field(
        default=4,
        ge=1,
        le=64,
        strict=True,
        **_option("disk_threads / --disk-threads", "give a whole number from 1 to 64, e.g. 4"),
    )
    fsync: Literal["never", "data", "always"] = Field(
        default="never",
        **_option("fsync / --fsync", "use 'never' (default), 'data' or 'always'"),
    )
    #: Seconds shutdown waits for queued and running transfers before it drops the rest.
    drain_deadline_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        **_option(
            "drain_deadline_s",
            "give seconds inside the orchestrator's grace period, e.g. 10 (default)",
        ),
    )
    shared: SharedTierSettings | None = Field(
        default=None,
        **_option("shared / --shared", "give the shared tier's settings, or leave it unset"),
    )

    def to_tier_config(self) -> dict[str, Any]:
        """The tier's entry in ``secondary_tiers``."""
        return {"type": DISK_TIER_TYPE, "module_path": DISK_TIER_MODULE, **self.to_dict()}


class SharedTierSettings(_Settings):
    """kvtier's shared tier (``KvtierSharedTier``) on Valkey / Redis, standalone or Cluster."""

    component: ClassVar[str] = "shared tier"

    url: str = Field(
        **_option(
            "shared / --shared",
            "give redis://HOST:PORT, rediss://HOST:PORT (TLS) or "
            "redis+cluster://HOST:PORT[,HOST:PORT...]",
        )
    )
    username: str | None = Field(default=None, **_option("shared_username", "give an ACL user"))
    password: SecretStr | None = Field(
        default=None,
        **_option("shared_password / KVTIER_SHARED_PASSWORD", "give the server's password"),
    )
    tls_ca_file: AbsolutePath | None = Field(
        default=None, **_option("shared_tls_ca_file", "give a PEM file of CA certificates")
    )
    tls_cert_file: AbsolutePath | None = Field(
        default=None, **_option("shared_tls_cert_file", "give a PEM client certificate")
    )
    tls_key_file: AbsolutePath | None = Field(
        default=None, **_option("shared_tls_key_file", "give the client certificate's key")
    )
    connect_timeout_s: float = Field(
        default=0.5, gt=0, le=60, **_option("shared_connect_timeout_s", "give seconds, e.g. 0.5")
    )
    op_timeout_s: float = Field(
        default=2.0, gt=0, le=600, **_option("shared_op_timeout_s", "give seconds, e.g. 2")
    )
    io_threads: int = Field(
        default=4, ge=1, le=64, strict=True, **_option("shared_threads", "give 1 to 64, e.g. 4")
    )
    max_queued_blocks: int = Field(
        default=1024,
        ge=1,
        strict=True,
        **_option("shared_max_queued_blocks", "give a positive whole number, e.g. 1024"),
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
            raise ValueError("not a redis://, rediss:// or redis+cluster:// URL")
        return url

    def to_tier_config(self) -> dict[str, Any]:
        return {"type": SHARED_TIER_TYPE, "module_path": SHARED_TIER_MODULE, **self.to_dict()}


DiskTierSettings.model_rebuild()


def tier_options(tier_config: Mapping[str, Any]) -> dict[str, Any]:
    """A tier's own options: its ``secondary_tiers`` entry less the factory's keys."""
    return {k: v for k, v in tier_config.items() if k not in FACTORY_KEYS}


def parse_tier(tier_config: Mapping[str, Any]) -> DiskTierSettings | SharedTierSettings | None:
    """Settings of a kvtier tier entry; None for a tier that is not kvtier's (e.g. ``fs``)."""
    kind = tier_config.get("type")
    if kind == DISK_TIER_TYPE:
        return DiskTierSettings.parse(tier_options(tier_config))
    if kind == SHARED_TIER_TYPE:
        return SharedTierSettings.parse(tier_options(tier_config))
    return None
