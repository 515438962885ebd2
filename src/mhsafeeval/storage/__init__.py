"""The event store: every message of a campaign, stored once, read back in order.

All campaign state is a fold over stored events (see :class:`EventStore`). Two stores ship:
:class:`SqliteEventStore` (a file; asyncio only) and :class:`MemoryEventStore` (no I/O; tests).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._log import AttemptFacts, CampaignLog, ConversationFacts, Outcome, RaterFacts, TurnRow
from ._memory import MemoryEventStore
from ._metrics import (
    ASR_AT,
    Agreement,
    CellMetrics,
    JudgeMetrics,
    ModelComparison,
    ModelMetrics,
    PairAgreement,
    RoleUsage,
    compare_models,
    compute_metrics,
    metrics_of,
    panel_vote,
)
from ._protocol import (
    SCHEMA_VERSION,
    CampaignInfo,
    EventStore,
    StorageError,
    StoredEvent,
    StoreStats,
)

if _TYPE_CHECKING:
    from ._sqlite import SqliteEventStore

__all__ = [
    "ASR_AT",
    "SCHEMA_VERSION",
    "Agreement",
    "AttemptFacts",
    "CampaignInfo",
    "CampaignLog",
    "CellMetrics",
    "ConversationFacts",
    "EventStore",
    "JudgeMetrics",
    "MemoryEventStore",
    "ModelComparison",
    "ModelMetrics",
    "Outcome",
    "PairAgreement",
    "RaterFacts",
    "RoleUsage",
    "SqliteEventStore",
    "StorageError",
    "StoreStats",
    "StoredEvent",
    "TurnRow",
    "compare_models",
    "compute_metrics",
    "metrics_of",
    "panel_vote",
]


def __getattr__(name: str) -> _Any:
    # aiosqlite is imported when the SQLite store is first asked for, not by every import.
    if name == "SqliteEventStore":
        from ._sqlite import SqliteEventStore

        return SqliteEventStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
