"""The event store: every message of a campaign, stored once, read back in order.

All campaign state is a fold over stored events (see :class:`EventStore`). Two stores ship:
:class:`SqliteEventStore` (a file; asyncio only) and :class:`MemoryEventStore` (no I/O; tests).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from mhsafeeval.runtime import lazy_exports as _lazy_exports

from ._log import TEXT_EVENTS, AttemptFacts, AttemptTexts, CampaignLog, Outcome, TextFold
from ._memory import MemoryEventStore
from ._metrics import (
    CampaignTally,
    ModelComparison,
    ModelMetrics,
    RoleUsage,
    compare_models,
    compute_metrics,
    metrics_of,
)
from ._protocol import EventStore, closing

if _TYPE_CHECKING:
    from ._sqlite import SqliteEventStore

__all__ = [
    "TEXT_EVENTS",
    "AttemptFacts",
    "AttemptTexts",
    "CampaignLog",
    "CampaignTally",
    "EventStore",
    "MemoryEventStore",
    "ModelComparison",
    "ModelMetrics",
    "Outcome",
    "RoleUsage",
    "SqliteEventStore",
    "TextFold",
    "closing",
    "compare_models",
    "compute_metrics",
    "metrics_of",
]


# aiosqlite is imported when the SQLite store is first asked for, not by every import.
__getattr__ = _lazy_exports(__name__, {"SqliteEventStore": "mhsafeeval.storage._sqlite"})
