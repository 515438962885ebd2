"""Event stores: every message of a run, stored once, read back in order.

:class:`EventStore` is the contract the engine writes to and every reader reads from. Two
stores ship: :class:`SqliteEventStore` (a file; asyncio only) and :class:`MemoryEventStore` (no
I/O; tests). They know messages, never what a campaign means by them.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from mhsafeeval.framework._plugins import lazy_exports as _lazy_exports

from ._memory import MemoryEventStore
from ._protocol import EventStore, closing

if _TYPE_CHECKING:
    from ._sqlite import SqliteEventStore

__all__ = ["EventStore", "MemoryEventStore", "SqliteEventStore", "closing"]

# aiosqlite is imported when the SQLite store is first asked for, not by every import.
__getattr__ = _lazy_exports(__name__, {"SqliteEventStore": "mhsafeeval.framework.store._sqlite"})
