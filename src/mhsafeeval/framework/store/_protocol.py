"""The event store contract: what every store does, and the records it hands back."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

import msgspec

from mhsafeeval.errors import MhSafeEvalError
from mhsafeeval.framework._message import Message

__all__ = [
    "SCHEMA_VERSION",
    "CampaignInfo",
    "EventStore",
    "StorageError",
    "StoreStats",
    "StoredEvent",
    "Summary",
    "WriteCounts",
    "closing",
]

SCHEMA_VERSION = 1
"""Version of the stored layout. Bumped only with a migration; newer databases are refused."""


class StorageError(MhSafeEvalError):
    """The store could not do what was asked: a failed write, a closed or read-only store.

    A failed background write is never dropped: it is raised (with the original error as
    ``__cause__``) by the next :meth:`EventStore.append`, :meth:`EventStore.flush` or
    :meth:`EventStore.aclose`.
    """


class CampaignInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A campaign known to the store.

    Attributes:
        id: The campaign id (the ``campaign`` correlation field of its messages).
        created_at: Unix time of registration (or of its first stored event).
        config: The campaign's configuration text as first registered (opaque to the store;
            ``""`` if none was given).
        schema_version: The storage schema the campaign was created under.
        event_count: Committed events of this campaign.
    """

    id: str
    created_at: float
    config: str
    schema_version: int
    event_count: int


class StoredEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One committed event, as read back.

    Attributes:
        seq: Position in the store, increasing in append order (gaps are possible).
        id: The message id (:attr:`Message.id`).
        type: The message tag.
        recorded_at: Unix time at which the store accepted the message.
        message: The decoded message; ``None`` when read with ``raw=True``.
        body: The stored JSON of the message; filled only when read with ``raw=True``.
    """

    seq: int
    id: str
    type: str
    recorded_at: float
    message: Message | None
    body: bytes = b""


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """Something a reader derived from a campaign's events and kept beside them, so the next
    reader need not fold them again (:meth:`EventStore.put_summary`).

    Attributes:
        key: What it was derived from, in the writer's own terms (for a report: the code that
            folded it and the position of the log it read); a reader that finds another key
            than its own folds the events again.
        body: The summary, encoded by whoever wrote it.
        written_at: Unix time it was stored.
    """

    key: str
    body: bytes
    written_at: float


class StoreStats(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a store's write counters since it was opened.

    Attributes:
        appended: Messages handed to :meth:`EventStore.append`.
        written: Messages committed as new events.
        duplicates: Messages ignored because their id was already stored.
        commits: Committed write transactions.
        pending: Messages accepted but not yet committed.
    """

    appended: int = 0
    written: int = 0
    duplicates: int = 0
    commits: int = 0
    pending: int = 0


class WriteCounts(msgspec.Struct):
    """A store's running write counters (:attr:`EventStore.stats` is a snapshot of them)."""

    appended: int = 0
    written: int = 0
    duplicates: int = 0
    commits: int = 0

    def snapshot(self, pending: int = 0) -> StoreStats:
        """The counters now, with ``pending`` messages accepted but not yet committed."""
        return StoreStats(
            appended=self.appended,
            written=self.written,
            duplicates=self.duplicates,
            commits=self.commits,
            pending=pending,
        )


@runtime_checkable
class EventStore(Protocol):
    """The durable record of a campaign: an append-only log of every message on the bus.

    Every piece of campaign state (transcripts, the harm archive, search trees, metrics) is a
    fold over the events a store hands back, so resume, reports and re-judging read one source
    of truth. A store keeps, per event, its message id; storing a message whose id is already
    stored is a no-op (counted in :attr:`stats` as a duplicate), which is what lets a resumed
    campaign replay work without writing anything twice.

    Writes are asynchronous and batched: :meth:`append` queues a message and returns before it
    is committed; :meth:`flush` returns once everything appended before it is committed. Reads
    (:meth:`events`, :meth:`event_ids`, :meth:`count`, :meth:`list_campaigns`) see committed
    events only, so flush first to read your own writes. A failed write is raised by the next
    ``append``/``flush``/``aclose`` as :class:`StorageError`; it is never dropped.

    Use a store as an async context manager, or call :meth:`open` and :meth:`aclose` from the
    same task (a store may own a task group for its writer). Leaving the context flushes what
    is queued, even when the body raised or was cancelled, and releases every resource.

    Implementations: :class:`~mhsafeeval.storage.SqliteEventStore` (a file; asyncio only) and
    :class:`~mhsafeeval.storage.MemoryEventStore` (no I/O; any anyio backend; for tests).

    Example:
        >>> import anyio
        >>> from mhsafeeval.framework._message import Message
        >>> from mhsafeeval.storage import EventStore, MemoryEventStore
        >>> class Note(Message, frozen=True, tag="example.note"):
        ...     text: str
        >>> async def main(store: EventStore) -> list[str]:
        ...     async with store:
        ...         await store.register_campaign("c1", config='{"seed": 7}')
        ...         await store.append(Note(campaign="c1", turn=0, text="hello"))
        ...         await store.append(Note(campaign="c1", turn=0, text="hello"))  # same id
        ...         await store.append(Note(campaign="c1", turn=1, text="again"))
        ...         await store.flush()
        ...         notes = [e.message.text async for e in store.events("c1")
        ...                  if isinstance(e.message, Note)]
        ...         return [*notes, f"duplicates={store.stats.duplicates}"]
        >>> anyio.run(main, MemoryEventStore())
        ['hello', 'again', 'duplicates=1']
    """

    @property
    def stats(self) -> StoreStats:
        """Write counters since the store was opened (a snapshot; no I/O)."""
        ...

    async def open(self) -> None:
        """Open (and if needed create) the store.

        Raises:
            InputError: The backing file is missing (read-only), not a store, or newer.
        """
        ...

    async def aclose(self) -> None:
        """Commit what is queued, stop background work and release every resource.

        Safe to call more than once, and after a failed :meth:`open`.

        Raises:
            StorageError: A background write failed and no caller has been told yet.
        """
        ...

    async def __aenter__(self) -> Self:
        """Open the store and return it."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store (see :meth:`aclose`)."""
        ...

    async def register_campaign(self, campaign_id: str, config: str = "") -> CampaignInfo:
        """Create a campaign, or return the existing one.

        The first non-empty ``config`` is kept: a later call never replaces it (compare the
        returned ``config`` to detect a changed configuration on resume). Appending a message
        of an unregistered campaign registers it with an empty config.
        """
        ...

    async def append(self, message: Message) -> None:
        """Queue a message to be stored; returns before it is committed.

        Cheap: it only waits when the writer is far behind (backpressure).

        Raises:
            StorageError: The store is closed or read-only, or an earlier write failed.
        """
        ...

    async def flush(self) -> None:
        """Return once every message appended before this call is committed.

        Raises:
            StorageError: A write failed (the failed batch is rolled back, not half-stored).
        """
        ...

    async def list_campaigns(self) -> list[CampaignInfo]:
        """Every campaign, oldest first, with its committed event count."""
        ...

    def events(
        self,
        campaign: str,
        *,
        types: Collection[str] | None = None,
        after_seq: int = 0,
        raw: bool = False,
    ) -> AsyncIterator[StoredEvent]:
        """Committed events of a campaign in append order, streamed page by page.

        Args:
            campaign: The campaign id.
            types: Only these message tags (``None``: all).
            after_seq: Only events with ``seq`` greater than this (to resume a reader).
            raw: Do not decode: yield ``message=None`` and the stored JSON in ``body``. Use it
                to list stores written with message types this process has not imported.

        Raises:
            InputError: (typed path) a stored event cannot be decoded, e.g. its message class
                is not imported. The raw path never decodes.
        """
        ...

    async def supersede(self, campaign: str, ids: Collection[str]) -> int:
        """Move committed events out of the campaign's log into its superseded record, in one
        transaction (what is queued is committed first); returns how many moved.

        A resumed run retries the turn a conversation failed in; that turn's stored events
        (its failed calls, the failure of the conversation) would otherwise collide with the
        retry's. Nothing is deleted: :meth:`superseded` still counts them.
        """
        ...

    async def superseded(self, campaign: str) -> int:
        """How many events of a campaign were superseded (0 when none)."""
        ...

    async def event_ids(self, campaign: str) -> set[str]:
        """Ids of every committed event of a campaign (what a resumed run can skip)."""
        ...

    async def count(self, campaign: str) -> int:
        """Number of committed events of a campaign."""
        ...

    async def last_seq(self, campaign: str) -> int:
        """The ``seq`` of a campaign's newest committed event (0 when it has none)."""
        ...

    async def summary(self, campaign: str, kind: str) -> Summary | None:
        """The summary of ``kind`` last stored for a campaign (None: none was, or the file
        predates summaries). It may be stale: compare its ``key`` with your own."""
        ...

    async def put_summary(self, campaign: str, kind: str, key: str, body: bytes) -> None:
        """Store (or replace) a campaign's summary of ``kind``: never an event, never part of
        the log, so a reader that ignores summaries loses nothing.

        Raises:
            StorageError: The store is read-only or closed.
        """
        ...


@contextlib.asynccontextmanager
async def closing(events: AsyncIterator[StoredEvent]) -> AsyncIterator[AsyncIterator[StoredEvent]]:
    """A read of :meth:`EventStore.events`, closed when the block ends, also when it is left
    early: a reader left mid-page still holds the store's cursor until its generator closes.

    Example:
        >>> import anyio
        >>> from mhsafeeval.messages import ConversationFinished
        >>> from mhsafeeval.storage import MemoryEventStore
        >>> async def first(store: MemoryEventStore) -> str:
        ...     await store.append(ConversationFinished(campaign="c", turns=1))
        ...     async with closing(store.events("c")) as events:
        ...         async for stored in events:
        ...             return stored.type
        ...     return ""
        >>> anyio.run(first, MemoryEventStore())
        'conversation.finished'
    """
    try:
        yield events
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
