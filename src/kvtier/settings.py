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

The storage core reads its settings from these models too (``SharedStore`` takes a
``SharedTierSettings``; ``DiskStore`` checks its cap against ``DISK_MIN_CAPACITY_BYTES``), so
this module imports neither vLLM, redis-py nor the storage core (of ``kvtier.format`` only a
constant). Rules across fields are model validators; environment variables are
``kvtier.env``'s.
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
    model_validator,
)

from kvtier.errors import ConfigError
from kvtier.format.record import HEADER_BYTES
from kvtier.shared_url import URL_FORMS, ServerUrl, split_url
from kvtier.units import format_size, parse_size

SPEC_NAME = "KvtierCpuSpec"
SPEC_MODULE = "kvtier.vllm.spec"
#: The spec of ``platform="cuda"``: vLLM's own host pool, kvtier's tiers registered by name.
CUDA_SPEC_NAME = "KvtierCudaSpec"
CUDA_SPEC_MODULE = "kvtier.vllm.cuda_spec"
#: The key of kvtier's own options inside ``kv_connector_extra_config``.
SPEC_OPTIONS_KEY = "kvtier"
DISK_TIER_TYPE = "KvtierDiskTier"
DISK_TIER_MODULE = "kvtier.vllm.disk_tier"
SHARED_TIER_TYPE = "KvtierSharedTier"
SHARED_TIER_MODULE = "kvtier.vllm.shared_tier"
#: Keys vLLM's ``SecondaryTierFactory`` reads itself from a tier's dict; not ours to check.
FACTORY_KEYS = frozenset({"type", "module_path", "locality", "backpressure"})
#: The least a disk folder's index files (database, WAL, shared memory, namespace.json files)
#: are charged against its cap (kvtier.store.disk.root charges them at least this much). Defined
#: here because the smallest cap a user may give is derived from it.
#: (The WAL's bound, 4 MiB + 384 KiB, the database and shared memory as created, 192 KiB of
#: growth.)
DISK_INDEX_ALLOWANCE_BYTES = 4832 << 10
#: The smallest disk cap: the index allowance and one record header, plus a byte of payload.
#: ``DiskTierSettings`` refuses less at start-up and ``DiskStore`` checks the same constant,
#: so no cap passes start-up and fails later on the tier's opener thread.
DISK_MIN_CAPACITY_BYTES = DISK_INDEX_ALLOWANCE_BYTES + HEADER_BYTES + 1
#: Inputs never echoed in an error message (a URL with user info may carry a password; so may
#: the shared tier's settings nested in the disk tier's).
_HIDDEN_INPUTS = ("password", "url", "shared")


def _to_bytes(value: Any) -> Any:
    """Sizes as people write them (``"4GiB"``) become ints; other types go to pydantic."""
    if isinstance(value, bool):
        raise ValueError("not a size; give bytes or a size such as '4GiB'")
    if isinstance(value, str | int):
        try:
            return parse_size(value)
        except ConfigError as exc:
            # parse_size says "size=<value> is ..."; the field and value are named by _explain.
            detail = str(exc)
            raise ValueError(detail.split(" is ", 1)[-1]) from None
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


def with_fix(fix: str) -> dict[str, Any]:
    """Field metadata of a setting with no user-facing option of its own: how to fix it."""
    return {"json_schema_extra": {"fix": fix}}


class SettingsModel(BaseModel):
    """Frozen, strict about unknown keys; a bad value is a ``ConfigError`` naming the field,
    its option and its fix, whether the model is built by ``parse`` or by its constructor."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
    #: Name of the component in error messages.
    component: ClassVar[str] = "kvtier"

    def __init__(self, **data: Any) -> None:
        # Built in code (tests, the storage core's callers) a bad value is the same
        # ConfigError as from ``parse``, not pydantic's ValidationError.
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(type(self)._explain(exc)) from None

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
        # The constructor turns validation errors into ConfigError (pydantic runs a custom
        # __init__ from model_validate too, so there is one way in).
        return cls(**{str(k): v for k, v in data.items()})

    @classmethod
    def _explain(cls, exc: ValidationError) -> str:
        lines = []
        for error in exc.errors(include_url=False):
            message = str(error["msg"]).removeprefix("Value error, ")
            if not error["loc"]:  # a model validator: a rule across fields, named in its text
                lines.append(message)
                continue
            field = str(error["loc"][0])
            info = cls.model_fields.get(field)
            extra = (info.json_schema_extra if info is not None else None) or {}
            option = extra.get("option") if isinstance(extra, dict) else None
            fix = extra.get("fix") if isinstance(extra, dict) else None
            given = error.get("input")
            # A URL without "@" has no user info, so no password to hide.
            hidden = any(word in field for word in _HIDDEN_INPUTS) and not (
                field == "url" and isinstance(given, str) and "@" not in given
            )
            shown = "<hidden>" if hidden else repr(given)
            where = f"{field} ({option})" if option else field
            lines.append(f"{where}={shown}: {message}" + (f"; {fix}" if fix else ""))
        return f"kvtier: invalid {cls.component} option: " + "; ".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict that ``parse`` reads back to an equal object (secrets included)."""
        out = self.model_dump(mode="json")
        for name, value in self:
            if isinstance(value, SecretStr):
                out[name] = value.get_secret_value()
            elif isinstance(value, SettingsModel):
                out[name] = value.to_dict()
        return out


class HostPoolSettings(SettingsModel):
    """The CPU spec: host-RAM pool (the first tier after the engine's own KV cache)."""

    component: ClassVar[str] = "host pool"

    #: Size of the host-RAM pool in bytes (or '4GiB'), total over all tensor-parallel ranks; blocks
    #: evicted from the engine's KV cache are restored from here.
    host_pool_bytes: Bytes = Field(
        default=2 * 2**30,
        gt=0,
        **_option("host_pool / --host-pool", "give the host pool a size such as '4GiB'"),
    )
    #: Back the host pool with a sparse 0600 file in this local folder instead of /dev/shm, for a
    #: pool larger than the RAM you can spare; unset: RAM.
    host_pool_dir: AbsolutePath | None = Field(
        default=None,
        **_option(
            "host_pool_dir / --host-pool-dir",
            "give a folder on a local disk, such as '/var/cache/kvtier/pool', or leave it unset",
        ),
    )
    #: Start even when a tier cannot hold more than the engine's own KV pool (it would never serve
    #: a restore): warn instead of refusing.
    allow_small_tiers: bool = Field(
        default=False,
        strict=True,
        **_option("allow_small_tiers / --allow-small-tiers", "give true or false"),
    )
    #: Restore a tier's hit only when its measured restore time beats recomputing the same tokens,
    #: and skip a disk's stores while no restore from it could pay; false restores every hit and
    #: writes every store (load deadlines apply either way).
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


#: Environment variable of the master keys (``EncryptionSettings.key_env``).
MASTER_KEY_VARIABLE = "KVTIER_MASTER_KEY"


class EncryptionSettings(SettingsModel):
    """Encryption at rest of the disk and shared tiers (AES-256-GCM), and tenant isolation.

    The settings name where the master keys are, never the keys: files are read, and their
    permissions checked, in the engine's processes when the tier starts
    (``kvtier.format.keyfiles``).
    """

    component: ClassVar[str] = "encryption"

    #: Files of the master keys, private to the engine's user (0600 or 0400, owned by it), each
    #: 32 random bytes or their 64 hex digits; the first seals new records, the others only open
    #: records written before a rotation.
    key_files: tuple[AbsolutePath, ...] = Field(
        default=(),
        **_option(
            "encryption_key_files / --encryption-key-file",
            "give files made with `(umask 077; openssl rand -hex 32 > /etc/kvtier/key)`",
        ),
    )
    #: Read the master keys from KVTIER_MASTER_KEY in the engine's processes (64 hex digits
    #: each, comma-separated, the first sealing new records) instead of files.
    key_env: bool = Field(
        default=False,
        strict=True,
        **_option(
            "encryption_key_env / --encryption-key-env",
            f"give true to read the keys from {MASTER_KEY_VARIABLE}, or false",
        ),
    )
    #: Keep requests without a cache_salt out of the disk and shared tiers (no store, no
    #: lookup there); the host pool serves them as before. The salt reaches the tiers through
    #: kvtier's connector (kvtier.runtime.tenants); a request it did not tag counts as
    #: unsalted.
    require_cache_salt: bool = Field(
        default=False,
        strict=True,
        **_option("require_cache_salt / --require-cache-salt", "give true or false"),
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> Self:
        if bool(self.key_files) == self.key_env:
            raise ValueError(
                "encryption needs its master keys from exactly one place: give "
                "encryption_key_files (--encryption-key-file) or encryption_key_env=True "
                f"(--encryption-key-env, keys in {MASTER_KEY_VARIABLE}), not both or neither"
            )
        if len(set(self.key_files)) != len(self.key_files):
            raise ValueError("encryption_key_files names a file twice; give each key once")
        return self


class DiskTierSettings(SettingsModel):
    """kvtier's disk tier (``KvtierDiskTier``): verified, bounded, crash-safe records."""

    component: ClassVar[str] = "disk tier"

    #: Folder of the persistent disk tier; its blocks survive restarts and are served to a fresh
    #: process.
    root_dir: AbsolutePath = Field(
        **_option("disk_dir / --disk-dir", "give the disk tier's folder, e.g. /var/cache/kvtier")
    )
    #: Byte cap of the folder, stored in the folder and shared by every engine using it; unset
    #: keeps the folder's cap (a new folder: a quarter of its file system, at most 256 GiB).
    capacity_bytes: Bytes | None = Field(
        default=None,
        **_option(
            "disk_capacity / --disk-capacity",
            "give a size such as '64GiB', or leave it unset to keep the folder's cap "
            "(a new folder gets a quarter of its file system, at most 256 GiB)",
        ),
    )
    #: Free space the disk tier leaves on the file system; unset: 5 % of it, at most 10 GiB.
    free_space_floor_bytes: Bytes | None = Field(
        default=None,
        ge=0,
        **_option(
            "free_space_floor_bytes",
            "give a size such as '10GiB', or leave it unset (5 % of the file system, <= 10 GiB)",
        ),
    )
    #: I/O threads per direction (reads, writes), at background I/O priority.
    io_threads: int = Field(
        default=4,
        ge=1,
        le=64,
        strict=True,
        **_option("disk_threads / --disk-threads", "give a whole number from 1 to 64, e.g. 4"),
    )
    #: When a record is synced: never (a crash loses only the newest records; every load is
    #: checksummed), data, or always (data and folder).
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
    #: The shared tier behind this disk tier: read after the local disk, hits written back to it.
    shared: SharedTierSettings | None = Field(
        default=None,
        **_option("shared / --shared", "give the shared tier's settings, or leave it unset"),
    )
    #: Encrypt records (and hide their names) on this disk tier and the shared tier behind it;
    #: unset: plain records.
    encryption: EncryptionSettings | None = Field(
        default=None,
        **_option(
            "encryption_key_files / encryption_key_env",
            "give the encryption settings, or leave them unset",
        ),
    )

    @model_validator(mode="after")
    def _one_encryption(self) -> Self:
        if self.shared is not None and self.shared.encryption is not None:
            raise ValueError(
                "the shared tier behind a disk tier is encrypted with the disk tier's keys; "
                "give the encryption options once, on the disk tier"
            )
        return self

    @field_validator("capacity_bytes")
    @classmethod
    def _holds_the_index(cls, capacity: int | None) -> int | None:
        if capacity is not None and capacity < DISK_MIN_CAPACITY_BYTES:
            raise ValueError(
                f"below the smallest disk cap, {DISK_MIN_CAPACITY_BYTES} bytes "
                f"({format_size(DISK_MIN_CAPACITY_BYTES)}: the index files are charged "
                "against the cap, and a record needs its 4 KiB header)"
            )
        return capacity

    def to_tier_config(self) -> dict[str, Any]:
        """The tier's entry in ``secondary_tiers``."""
        return {"type": DISK_TIER_TYPE, "module_path": DISK_TIER_MODULE, **self.to_dict()}


class SharedTierSettings(SettingsModel):
    """kvtier's shared tier (``KvtierSharedTier``) on Valkey / Redis, standalone or Cluster.

    Also the shared store's own configuration (``kvtier.store.shared.SharedStore`` takes it).
    Credentials given in the URL move to ``username``/``password`` when it is parsed (those
    options win over the URL's), so ``url`` never holds a secret: it is ``ServerUrl.redacted``.
    """

    component: ClassVar[str] = "shared tier"

    #: Server URL: redis://, rediss:// (TLS), redis+cluster:// or rediss+cluster:// with
    #: comma-separated nodes.
    url: str = Field(**_option("shared / --shared", f"give {URL_FORMS}"))
    #: ACL user; unset: the server's default user.
    username: str | None = Field(default=None, **_option("shared_username", "give an ACL user"))
    #: Server password; kvtier serve and kv_transfer_config read it from KVTIER_SHARED_PASSWORD
    #: inside the engine, so it stays off command lines.
    password: SecretStr | None = Field(
        default=None,
        **_option("shared_password / KVTIER_SHARED_PASSWORD", "give the server's password"),
    )
    #: PEM file of the CA certificates that signed the server's certificate (rediss://).
    tls_ca_file: AbsolutePath | None = Field(
        default=None, **_option("shared_tls_ca_file", "give a PEM file of CA certificates")
    )
    #: PEM client certificate, for servers that require one.
    tls_cert_file: AbsolutePath | None = Field(
        default=None, **_option("shared_tls_cert_file", "give a PEM client certificate")
    )
    #: Key of the client certificate.
    tls_key_file: AbsolutePath | None = Field(
        default=None,
        repr=False,
        **_option("shared_tls_key_file", "give the client certificate's key"),
    )
    #: Seconds to connect to a server before the operation fails (and the breaker counts it).
    connect_timeout_s: float = Field(
        default=0.5, gt=0, le=60, **_option("shared_connect_timeout_s", "give seconds, e.g. 0.5")
    )
    #: Seconds one server operation may take (a 6 MiB GET takes ~4 ms on loopback).
    op_timeout_s: float = Field(
        default=2.0, gt=0, le=600, **_option("shared_op_timeout_s", "give seconds, e.g. 2")
    )
    #: Retries after a connection error or timeout before the operation misses.
    retries: int = Field(
        default=1,
        ge=0,
        le=3,
        strict=True,
        **_option("shared_retries", "give 0 to 3 (each retry can cost op_timeout_s)"),
    )
    #: Largest record (header + payload) a put sends; unset: 1/8 of the smallest maxmemory.
    max_record_bytes: Bytes | None = Field(
        default=None,
        gt=0,
        **_option(
            "shared_max_record_bytes",
            "give a size such as '64MiB', or leave it unset (1/8 of the server's maxmemory)",
        ),
    )
    #: First circuit-breaker back-off after a server fault; doubles per failed probe.
    breaker_base_s: float = Field(
        default=0.5, gt=0, le=60, **_option("shared_breaker_base_s", "give seconds, e.g. 0.5")
    )
    #: Longest circuit-breaker back-off.
    breaker_max_s: float = Field(
        default=30.0, gt=0, le=3600, **_option("shared_breaker_max_s", "give seconds, e.g. 30")
    )
    #: Most keys kept in the in-memory view that answers lookups (LRU beyond that); ~200
    #: bytes of process memory each.
    view_max_keys: int = Field(
        default=262_144,
        ge=1,
        strict=True,
        **_option("shared_view_max_keys", "give a positive whole number, e.g. 262144"),
    )
    #: I/O threads of the shared tier.
    io_threads: int = Field(
        default=4, ge=1, le=64, strict=True, **_option("shared_threads", "give 1 to 64, e.g. 4")
    )
    #: Stores waiting for the server beyond this are dropped and counted (behind a disk tier,
    #: only their server part: the disk is still written). Unset: half the host pool's rows,
    #: since each waiting block holds its row in the pool.
    max_queued_blocks: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        **_option(
            "shared_max_queued_blocks",
            "give a positive whole number, or leave it unset for half the host pool",
        ),
    )
    #: Encrypt values (and hide their keys) on the server; unset: plain records. Behind a disk
    #: tier, the disk tier's `encryption` applies instead.
    encryption: EncryptionSettings | None = Field(
        default=None,
        **_option(
            "encryption_key_files / encryption_key_env",
            "give the encryption settings, or leave them unset",
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _credentials_out_of_the_url(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("url"), str):
            return data
        try:
            server = split_url(data["url"])
        except ValueError:
            return data  # the url field's own check reports it, naming the option
        data = {**data, "url": server.redacted}
        if server.username is not None and data.get("username") is None:
            data["username"] = server.username
        if server.password is not None and data.get("password") is None:
            data["password"] = server.password
        return data

    @field_validator("url")
    @classmethod
    def _known_form(cls, url: str) -> str:
        split_url(url)  # raises ValueError saying what is wrong, never echoing the URL
        return url

    @model_validator(mode="after")
    def _rules_across_fields(self) -> Self:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "shared_tls_cert_file and shared_tls_key_file go together; give both or neither"
            )
        if not self.server.tls and (self.tls_ca_file or self.tls_cert_file):
            raise ValueError(
                f"TLS files are given but url={self.url} is not TLS; use rediss:// "
                "(or rediss+cluster://), or remove the shared_tls_* options"
            )
        if self.breaker_max_s < self.breaker_base_s:
            raise ValueError(
                f"shared_breaker_max_s={self.breaker_max_s} is below shared_breaker_base_s="
                f"{self.breaker_base_s}; give a longest back-off >= the first"
            )
        return self

    @property
    def server(self) -> ServerUrl:
        """The parsed ``url`` (which holds no credentials)."""
        return split_url(self.url)

    @property
    def password_text(self) -> str | None:
        """The password in clear, for the client library only: never log it."""
        return None if self.password is None else self.password.get_secret_value()

    def with_password(self, password: SecretStr | None) -> SharedTierSettings:
        """These settings with ``password`` where none was given (the engine's environment
        variable fills it in, so it never travels in the serialised config)."""
        if self.password is not None or password is None:
            return self
        return self.model_copy(update={"password": password})

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
