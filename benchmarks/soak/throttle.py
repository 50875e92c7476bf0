"""The soak's throttled disk, engine-process side: the stock disk tier (shared tier behind it
included) whose folder reads go through ``tests.support.throttled_tier.ThrottledReader``.

The runner throttles a server's record reads by writing a rate into the control file named by
``KVTIER_TEST_THROTTLE_FILE`` (``ThrottledDisk.throttle``). Unlike the tests' throttled tier
this one keeps the shared store behind the disk, so the server stays a full replica.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvtier.format import Namespace
from kvtier.settings import DiskTierSettings
from kvtier.store import BlockStore, RecordIO, RecordWriter
from kvtier.vllm.disk_tier import KvtierDiskTier, open_disk_store
from tests.support.throttled_tier import CONTROL_ENV, ThrottledReader


class SoakThrottledDiskTier(KvtierDiskTier):
    """``KvtierDiskTier`` whose folder reads the soak can slow down or stall."""

    def open_store(self, settings: DiskTierSettings, namespace: Namespace) -> BlockStore:
        """The stock tier's store (shared tier behind it included), folder reads throttled."""
        reader = ThrottledReader(Path(os.environ[CONTROL_ENV]))
        io = RecordIO(RecordWriter(settings.fsync), reader)
        return open_disk_store(settings, namespace, self.store_sealer, io=io)


def transfer_config(**options: Any) -> dict[str, Any]:
    """``kvtier.kv_transfer_config(**options)`` with the disk tier swapped for this one."""
    import kvtier

    config = kvtier.kv_transfer_config(**options)
    extra = config["kv_connector_extra_config"]
    (tier,) = extra["secondary_tiers"]
    tier.update(type=SoakThrottledDiskTier.__name__, module_path=__name__)
    return config
