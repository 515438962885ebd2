"""What a store already holds of a run: the input of a resumed one."""

from __future__ import annotations

from collections.abc import Callable, Collection

import structlog

from mhsafeeval.messages import CallFailed, CampaignFinished, ConversationFinished
from mhsafeeval.runtime import HandlerFailed, Message
from mhsafeeval.storage import EventStore

__all__ = ["Stored", "load_stored", "to_retry"]

log = structlog.get_logger("mhsafeeval.engine")


class Stored:
    """The stored messages of one campaign, indexed for resuming it.

    ``starts``: the ids of the planned start messages; a conversation whose start message is
    stored has started.
    """

    def __init__(self, messages: list[Message], starts: Collection[str]) -> None:
        self.messages = messages
        self.ids = {m.id for m in messages}
        self.children: dict[str, list[Message]] = {}
        for m in messages:
            if m.causation:
                self.children.setdefault(m.causation, []).append(m)
        self.started = [m.conversation for m in messages if m.id in starts]
        self.finished = {
            m.conversation: m.status for m in messages if isinstance(m, ConversationFinished)
        }
        self.broken = {m.conversation: m for m in messages if isinstance(m, HandlerFailed)}
        self.outcome = next(
            (
                m
                for m in reversed(messages)
                if isinstance(m, CampaignFinished) and m.key == "finish"
            ),
            None,
        )

    @property
    def failed(self) -> int:
        """Finished conversations that did not complete."""
        return sum(status != "completed" for status in self.finished.values())


async def load_stored(
    store: EventStore,
    campaign: str,
    starts: Collection[str],
    *,
    accepts: Callable[[str], None],
    settled: tuple[type[Message], ...],
    on_bus: Callable[[Message], bool],
) -> Stored | None:
    """The stored part of ``campaign``, or None if the store has none.

    ``accepts(stored_config)`` raises when the stored campaign was run with another
    configuration (before anything is written). The failed turns :func:`to_retry` names are
    moved aside (superseded, never deleted) so that the run does them again.
    """
    info = next((c for c in await store.list_campaigns() if c.id == campaign), None)
    if info is None or info.event_count == 0:
        return None
    accepts(info.config)
    messages = [e.message async for e in store.events(campaign) if e.message is not None]
    retry = to_retry(messages, starts, settled, on_bus)
    if retry:
        gone = {m.id for m in retry}
        moved = await store.supersede(campaign, gone)
        log.info("campaign.retrying_failed_turns", superseded=moved)
        messages = [m for m in messages if m.id not in gone]
    return Stored(messages, starts)


def to_retry(
    messages: list[Message],
    starts: Collection[str],
    settled: tuple[type[Message], ...],
    on_bus: Callable[[Message], bool],
) -> list[Message]:
    """What to move aside so that each failed or stalled conversation picks up where it stopped.

    * A role that never answered (a call that failed for good: :attr:`CallFailed.owed`), or a
      conversation that stalled: only those failure records and the conversation's end record.
      Resuming then finds the messages they answered unanswered and hands them to their agents
      again, so stored answers are kept and the turn goes on from there.
    * Otherwise, a turn that settled nothing (no message of a ``settled`` type, the ones that
      change what other conversations see): that turn's events, so it is retried from its start.
    * A failure after something settled (a crashed handler, say) stays as it is.

    The campaign's end record goes too whenever anything is moved. Messages that never travel
    on the bus (``on_bus`` false) are never owed work; start messages (ids in ``starts``) stay.
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
        owed = [m for m in tail if isinstance(m, CallFailed) and m.owed and on_bus(m)]
        if owed or ended[conversation].status == "stalled":
            out += owed
            out += [m for m in tail if isinstance(m, ConversationFinished)]
        elif not any(isinstance(m, settled) for m in tail):
            out += tail
    if out:
        out += [m for m in messages if isinstance(m, CampaignFinished) and m.key == "finish"]
    return out
