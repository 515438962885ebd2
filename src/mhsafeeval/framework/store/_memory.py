"""An event store kept in memory: no I/O, any anyio backend. For tests and dry runs."""

from __future__ import annotations

import bisect
import time
from collections.abc import AsyncIterator, Callable, Collection

import anyio.lowlevel

from mhsafeeval.framework._message import Message, encode_message
from mhsafeeval.framework._resource import AsyncResource

from ._protocol import (
    SCHEMA_VERSION,
    CampaignInfo,
    StorageError,
    StoredEvent,
    StoreStats,
    Summary,
    WriteCounts,
)

__all__ = ["MemoryEventStore"]


class _Campaign:
    __slots__ = ("config", "created_at", "events", "superseded")

    def __init__(self, created_at: float) -> None:
        self.created_at = created_at
        self.config = ""
        self.events: list[StoredEvent] = []
        self.superseded: list[StoredEvent] = []


class MemoryEventStore(AsyncResource):
    """An :class:`~mhsafeeval.storage.EventStore` that keeps events in lists.

    Every append is committed at once, so ``flush`` only reports errors. Same ids, ordering,
    duplicate semantics and ``seq`` numbering as the SQLite store; nothing survives the object.

    Args:
        page_size: Events yielded between checkpoints by :meth:`events`.
        clock: Source of ``recorded_at``/``created_at`` (Unix seconds).

    Example:
        >>> import anyio
        >>> from mhsafeeval.messages import ConversationFinished
        >>> async def main() -> list[str]:
        ...     async with MemoryEventStore() as store:
        ...         await store.append(ConversationFinished(campaign="c", turns=2))
        ...         return [e.type async for e in store.events("c")]
        >>> anyio.run(main)
        ['conversation.finished']
    """

    def __init__(self, *, page_size: int = 500, clock: Callable[[], float] = time.time) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self._page_size = page_size
        self._clock = clock
        self._campaigns: dict[str, _Campaign] = {}
        self._summaries: dict[tuple[str, str], Summary] = {}
        self._ids: set[str] = set()
        self._seq = 0
        self._closed = False
        self._counts = WriteCounts()

    @property
    def stats(self) -> StoreStats:
        """Write counters since the store was created (every write is its own commit)."""
        return self._counts.snapshot()

    async def open(self) -> None:
        """Reopen the store (its events are kept)."""
        self._closed = False
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Mark the store closed; events stay readable."""
        self._closed = True
        await anyio.lowlevel.checkpoint()

    def _campaign(self, campaign_id: str) -> _Campaign:
        found = self._campaigns.get(campaign_id)
        if found is None:
            found = self._campaigns[campaign_id] = _Campaign(self._clock())
        return found

    def _info(self, campaign_id: str, c: _Campaign) -> CampaignInfo:
        return CampaignInfo(
            id=campaign_id,
            created_at=c.created_at,
            config=c.config,
            schema_version=SCHEMA_VERSION,
            event_count=len(c.events),
        )

    async def register_campaign(self, campaign_id: str, config: str = "") -> CampaignInfo:
        """Create a campaign, or return it; the first non-empty config is kept."""
        await anyio.lowlevel.checkpoint()
        c = self._campaign(campaign_id)
        if not c.config:
            c.config = config
        return self._info(campaign_id, c)

    async def append(self, message: Message) -> None:
        """Store a message now (a stored id is a counted no-op)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise StorageError("the event store is closed")
        encode_message(message)  # fail here, as the SQLite store does, if it cannot be encoded
        self._counts.appended += 1
        if message.id in self._ids:
            self._counts.duplicates += 1
            return
        self._ids.add(message.id)
        self._seq += 1
        event = StoredEvent(
            seq=self._seq,
            id=message.id,
            type=message.tag,
            recorded_at=self._clock(),
            message=message,
        )
        self._campaign(message.campaign).events.append(event)
        self._counts.written += 1
        self._counts.commits += 1

    async def flush(self) -> None:
        """Nothing is ever pending; only a checkpoint."""
        await anyio.lowlevel.checkpoint()

    async def list_campaigns(self) -> list[CampaignInfo]:
        """Every campaign, oldest first."""
        await anyio.lowlevel.checkpoint()
        ordered = sorted(self._campaigns.items(), key=lambda kv: (kv[1].created_at, kv[0]))
        return [self._info(cid, c) for cid, c in ordered]

    async def events(
        self,
        campaign: str,
        *,
        types: Collection[str] | None = None,
        after_seq: int = 0,
        raw: bool = False,
    ) -> AsyncIterator[StoredEvent]:
        """Events of a campaign in append order (sees events appended while iterating)."""
        wanted = None if types is None else frozenset(types)
        c = self._campaigns.get(campaign)
        index = 0 if c is None else bisect.bisect_right(c.events, after_seq, key=_seq)
        while True:
            await anyio.lowlevel.checkpoint()
            if c is None or index >= len(c.events):
                return
            page = c.events[index : index + self._page_size]
            index += len(page)
            for event in page:
                if wanted is not None and event.type not in wanted:
                    continue
                if raw and event.message is not None:
                    body = encode_message(event.message)
                    yield StoredEvent(
                        seq=event.seq,
                        id=event.id,
                        type=event.type,
                        recorded_at=event.recorded_at,
                        message=None,
                        body=body,
                    )
                else:
                    yield event

    async def supersede(self, campaign: str, ids: Collection[str]) -> int:
        """Move events of a campaign aside (see the protocol)."""
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise StorageError("the event store is closed")
        c = self._campaigns.get(campaign)
        chosen = set(ids)
        if c is None or not chosen:
            return 0
        moved = [e for e in c.events if e.id in chosen]
        c.events = [e for e in c.events if e.id not in chosen]
        c.superseded.extend(moved)
        self._ids.difference_update(e.id for e in moved)
        return len(moved)

    async def superseded(self, campaign: str) -> int:
        """How many events of a campaign were superseded."""
        await anyio.lowlevel.checkpoint()
        c = self._campaigns.get(campaign)
        return 0 if c is None else len(c.superseded)

    async def event_ids(self, campaign: str) -> set[str]:
        """Ids of every event of a campaign."""
        await anyio.lowlevel.checkpoint()
        c = self._campaigns.get(campaign)
        return set() if c is None else {e.id for e in c.events}

    async def count(self, campaign: str) -> int:
        """Number of events of a campaign."""
        await anyio.lowlevel.checkpoint()
        c = self._campaigns.get(campaign)
        return 0 if c is None else len(c.events)

    async def last_seq(self, campaign: str) -> int:
        """The seq of a campaign's newest event (0: none)."""
        await anyio.lowlevel.checkpoint()
        c = self._campaigns.get(campaign)
        return c.events[-1].seq if c is not None and c.events else 0

    async def summary(self, campaign: str, kind: str) -> Summary | None:
        """A campaign's stored summary of ``kind`` (see the protocol)."""
        await anyio.lowlevel.checkpoint()
        return self._summaries.get((campaign, kind))

    async def put_summary(self, campaign: str, kind: str, key: str, body: bytes) -> None:
        """Store a campaign's summary of ``kind`` (see the protocol)."""
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise StorageError("the event store is closed")
        self._summaries[campaign, kind] = Summary(
            key=key, body=bytes(body), written_at=self._clock()
        )


def _seq(event: StoredEvent) -> int:
    return event.seq
