"""The campaign's reading of its stored events: the one fold of the log and the metrics.

All campaign state is a fold over stored events. The stores themselves are the framework's
(:mod:`mhsafeeval.framework.store`: :class:`EventStore`, :class:`SqliteEventStore`,
:class:`MemoryEventStore`), re-exported here for the campaign's readers.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from mhsafeeval.framework import lazy_exports as _lazy_exports
from mhsafeeval.framework.store import EventStore, MemoryEventStore, closing

from ._log import TEXT_EVENTS, AttemptFacts, AttemptTexts, CampaignLog, Outcome, TextFold
from ._metrics import (
    CampaignTally,
    ModelComparison,
    ModelMetrics,
    RoleUsage,
    compare_models,
    compute_metrics,
    metrics_of,
)

if _TYPE_CHECKING:
    from mhsafeeval.framework.store import SqliteEventStore

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
__getattr__ = _lazy_exports(__name__, {"SqliteEventStore": "mhsafeeval.framework.store._sqlite"})
