"""The event store: every message of a campaign, stored once, read back in order.

All campaign state is a fold over stored events (see :class:`EventStore`). Two stores ship:
:class:`SqliteEventStore` (a file; asyncio only) and :class:`MemoryEventStore` (no I/O; tests).
"""

from ._memory import MemoryEventStore
from ._metrics import ASR_AT, CellMetrics, ModelMetrics, RoleUsage, compute_metrics
from ._protocol import (
    SCHEMA_VERSION,
    CampaignInfo,
    EventStore,
    StorageError,
    StoredEvent,
    StoreStats,
)
from ._sqlite import SqliteEventStore

__all__ = [
    "ASR_AT",
    "SCHEMA_VERSION",
    "CampaignInfo",
    "CellMetrics",
    "EventStore",
    "MemoryEventStore",
    "ModelMetrics",
    "RoleUsage",
    "SqliteEventStore",
    "StorageError",
    "StoreStats",
    "StoredEvent",
    "compute_metrics",
]
