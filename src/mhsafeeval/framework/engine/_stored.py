"""What a store already holds of a run: the input of a resumed one, read as a stream.

A resumed run never holds the whole stored campaign. :func:`load_stored` streams it once to
build a compact index (per conversation: started, finished and how; an 8-byte fingerprint per
stored event) while callers' folds (the budget) take each message as it passes; the run then
streams it once more (:func:`stored_messages`) to replay it into the agents, keeping only the
messages of the conversations still open.
"""

from __future__ import annotations

import heapq
import sys
from array import array
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Collection, Sequence

import structlog

from mhsafeeval.framework import HandlerFailed, Message
from mhsafeeval.framework.lifecycle import CampaignFinished, ConversationFinished
from mhsafeeval.framework.store import EventStore, closing

__all__ = ["Fingerprints", "Stored", "load_stored", "never_owed", "stored_messages", "to_retry"]

log = structlog.get_logger("mhsafeeval.framework.engine")

_MASK = (1 << 64) - 1
_RUN = 1 << 12  # fingerprints sorted at a time, so sorting never holds many Python ints


def never_owed(msg: Message) -> bool:
    """The default of :attr:`Graph.owes`: no stored message records owed work."""
    return False


class Fingerprints:
    """A compact set of message ids: 8 bytes each (a 64-bit hash of the id), not ~100.

    A resumed run asks it whether what an agent publishes while stored messages are replayed
    was stored already. Two different ids share a fingerprint with odds of about one in 2**64
    per stored event (that message would be taken as stored).

    Example:
        >>> ids = Fingerprints()
        >>> for i in range(5):
        ...     ids.add(f"id{i}")
        >>> ids.freeze()
        >>> "id3" in ids, "id7" in ids, len(ids)
        (True, False, 5)
    """

    def __init__(self) -> None:
        self._runs: list[array[int]] = []
        self._current: array[int] = array("Q")
        self._sorted: array[int] = array("Q")

    def add(self, message_id: str) -> None:
        """Add an id (before :meth:`freeze`)."""
        self._current.append(hash(message_id) & _MASK)
        if len(self._current) >= _RUN:
            self._seal()

    def _seal(self) -> None:
        if self._current:
            self._runs.append(array("Q", sorted(self._current)))
            self._current = array("Q")

    def freeze(self) -> None:
        """Sort what was added (one merge of sorted runs; the first question does it too)."""
        self._seal()
        if self._sorted:
            self._runs.append(self._sorted)
        self._sorted = (
            self._runs[0] if len(self._runs) == 1 else array("Q", heapq.merge(*self._runs))
        )
        self._runs = []

    def __contains__(self, message_id: object) -> bool:
        if self._runs or self._current:
            self.freeze()
        key = hash(message_id) & _MASK
        at = bisect_left(self._sorted, key)
        return at < len(self._sorted) and self._sorted[at] == key

    def __len__(self) -> int:
        return len(self._sorted) + len(self._current) + sum(map(len, self._runs))


class Stored:
    """The index of one stored campaign, for resuming it: never its messages.

    Attributes:
        count: stored events (after failed turns were moved aside).
        last_seq: the store position of the last of them (a replay reads up to it).
        started: conversations whose planned start message is stored, not finished.
        finished: each finished conversation's status (``completed``, ``failed``, ...).
        broken: the stored handler failure of each conversation not finished.
        outcome: the campaign's stored end record (``key="finish"``), if it finished.
        ids: a fingerprint of every stored event's id (:class:`Fingerprints`).
    """

    def __init__(self) -> None:
        self.count = 0
        self.last_seq = 0
        self.started: set[str] = set()
        self.finished: dict[str, str] = {}
        self.broken: dict[str, HandlerFailed] = {}
        self.outcome: CampaignFinished | None = None
        self.ids = Fingerprints()

    def add(self, seq: int, message_id: str, msg: Message, starts: Collection[str]) -> None:
        """Index one stored message (in stored order)."""
        self.count += 1
        self.last_seq = max(self.last_seq, seq)
        self.ids.add(message_id)
        if message_id in starts:
            self.started.add(sys.intern(msg.conversation))
        if isinstance(msg, ConversationFinished):
            # Interned: one copy of each id and status, however many conversations.
            self.finished[sys.intern(msg.conversation)] = sys.intern(msg.status)
        elif isinstance(msg, HandlerFailed):
            self.broken[msg.conversation] = msg
        elif isinstance(msg, CampaignFinished) and msg.key == "finish":
            self.outcome = msg

    def close(self) -> None:
        """Done indexing: keep only what a resumed run asks (``started``: the conversations
        started and not finished; ``ids`` are sorted when first asked, once the callers'
        folds are gone)."""
        self.started.difference_update(self.finished)
        self.broken = {c: m for c, m in self.broken.items() if c not in self.finished}

    @property
    def failed(self) -> int:
        """Finished conversations that did not complete."""
        return sum(status != "completed" for status in self.finished.values())


async def stored_messages(
    store: EventStore, campaign: str, *, upto: int | None = None
) -> AsyncIterator[tuple[int, str, Message]]:
    """Stream ``campaign``'s stored messages in stored order as (seq, id, message), those at
    store positions up to ``upto`` (None: all)."""
    async with closing(store.events(campaign)) as events:
        async for event in events:
            if upto is not None and event.seq > upto:
                return
            if event.message is not None:
                yield event.seq, event.id, event.message


async def load_stored(
    store: EventStore,
    campaign: str,
    starts: Collection[str],
    *,
    accepts: Callable[[str], None],
    settled: tuple[type[Message], ...],
    on_bus: Callable[[Message], bool],
    owes: Callable[[Message], bool] = never_owed,
    folds: Sequence[Callable[[Message], object]] = (),
) -> Stored | None:
    """The index of the stored part of ``campaign``, or None if the store has none.

    ``accepts(stored_config)`` raises when the stored campaign was run with another
    configuration (before anything is written). ``owes(msg)``: whether a stored message
    records work still owed (see :func:`to_retry`). The failed turns :func:`to_retry` names are
    moved aside (superseded, never deleted) so that the run does them again. Each of ``folds``
    is then called with every stored message, in stored order, as the store streams it (what
    the stored part spent, say): nothing else keeps them.

    The store is read as a stream: a query of the end records (conversations and campaign),
    the messages of failed or stalled conversations when there are any (for :func:`to_retry`),
    then every message once.
    """
    info = next((c for c in await store.list_campaigns() if c.id == campaign), None)
    if info is None or info.event_count == 0:
        return None
    accepts(info.config)
    retry = await _failed_turns(store, campaign, starts, settled, on_bus, owes)
    if retry:
        moved = await store.supersede(campaign, retry)
        log.info("campaign.retrying_failed_turns", superseded=moved)
    stored = Stored()
    async for seq, message_id, msg in stored_messages(store, campaign):
        stored.add(seq, message_id, msg, starts)
        for fold in folds:
            fold(msg)
    stored.close()
    return stored


_END_TAGS = tuple(str(t.__struct_config__.tag) for t in (ConversationFinished, CampaignFinished))


async def _failed_turns(
    store: EventStore,
    campaign: str,
    starts: Collection[str],
    settled: tuple[type[Message], ...],
    on_bus: Callable[[Message], bool],
    owes: Callable[[Message], bool],
) -> set[str]:
    """The ids :func:`to_retry` moves aside, read without holding the campaign: the end
    records first, then, only if some conversation failed or stalled, those conversations'
    messages."""
    ends: list[Message] = []
    failing: set[str] = set()
    async for event in store.events(campaign, types=_END_TAGS):
        msg = event.message
        if isinstance(msg, ConversationFinished) and msg.status in ("failed", "stalled"):
            failing.add(msg.conversation)
        elif isinstance(msg, CampaignFinished) and msg.key == "finish":
            ends.append(msg)
    if not failing:
        return set()
    kept = [m async for _, _, m in stored_messages(store, campaign) if m.conversation in failing]
    return {m.id for m in to_retry(kept + ends, starts, settled, on_bus, owes)}


def to_retry(
    messages: list[Message],
    starts: Collection[str],
    settled: tuple[type[Message], ...],
    on_bus: Callable[[Message], bool],
    owes: Callable[[Message], bool] = never_owed,
) -> list[Message]:
    """What to move aside so that each failed or stalled conversation picks up where it stopped.

    * Work still owed (``owes``: in the MHSafeEval campaign, a call that failed for good,
      ``CallFailed.owed``), or a
      conversation that stalled: only those failure records and the conversation's end record.
      Resuming then finds the messages they answered unanswered and hands them to their agents
      again, so stored answers are kept and the turn goes on from there.
    * Otherwise, a turn that settled nothing (no message of a ``settled`` type, the ones that
      change what other conversations see): that turn's events, so it is retried from its start.
    * A failure after something settled (a crashed handler, say) stays as it is.

    The campaign's end record goes too whenever anything is moved. Messages that never travel
    on the bus (``on_bus`` false) are never owed work; start messages (ids in ``starts``) stay.
    Only the failed and stalled conversations' messages and the campaign's end records are
    read: :func:`load_stored` passes just those.
    """
    ended = {
        m.conversation: m
        for m in messages
        if isinstance(m, ConversationFinished) and m.status in ("failed", "stalled")
    }
    if not ended:
        return []
    tails: dict[str, list[Message]] = {c: [] for c in ended}
    for m in messages:
        end = ended.get(m.conversation)
        if end is not None and m.turn >= end.turn and m.id not in starts:
            tails[m.conversation].append(m)
    out: list[Message] = []
    for conversation, tail in tails.items():
        owed = [m for m in tail if owes(m) and on_bus(m)]
        if owed or ended[conversation].status == "stalled":
            out += owed
            out += [m for m in tail if isinstance(m, ConversationFinished)]
        elif not any(isinstance(m, settled) for m in tail):
            out += tail
    if out:
        out += [m for m in messages if isinstance(m, CampaignFinished) and m.key == "finish"]
    return out
