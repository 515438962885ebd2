"""A review session: one campaign's queue and review state, and the writes people make.

Every write is one event appended to the campaign's store and flushed before the caller is
answered, then folded into the in-memory state: the store has a single writer (this process),
so the state it serves is the store's. Several raters at once are several requests on one
event loop; their events go through the store's one batching writer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mhsafeeval.errors import InputError
from mhsafeeval.storage import EventStore
from mhsafeeval.taxonomy import Taxonomy, builtin_taxonomy

from ._events import (
    REVIEW_PUBLISHER,
    ReviewDecision,
    ReviewQueueDrawn,
    ReviewRating,
    ReviewUnblinded,
    Span,
    new_key,
)
from ._queue import CampaignReading, Item, draw_queue
from ._state import ReviewState

__all__ = ["ReviewError", "ReviewSession", "check_person", "open_session", "pick_campaign"]

_PERSON = re.compile(r"[\w][\w .@'-]{0,63}\Z")
MAX_COMMENT = 4000
MAX_SPANS = 50
BLINDED_VIEW = ("cell", "ladder", "history", "utterance", "reply")


class ReviewError(ValueError):
    """A write that cannot be taken as it is (the page says why)."""


def check_person(name: str) -> str:
    """A rater's or adjudicator's name, trimmed: 1-64 letters, digits, spaces and ``.@'-_``.

    Example:
        >>> check_person("  Dr. Ana Ruiz ")
        'Dr. Ana Ruiz'
    """
    name = name.strip()
    if not _PERSON.match(name):
        raise ReviewError(
            "a name is 1-64 letters, digits, spaces or .@'-_, starting with a letter or digit"
        )
    return name


def _spans(spans: Sequence[tuple[int, int]], reply: str) -> tuple[Span, ...]:
    if len(spans) > MAX_SPANS:
        raise ReviewError(f"at most {MAX_SPANS} spans")
    out = []
    for start, end in spans:
        if not 0 <= start < end <= len(reply):
            raise ReviewError(f"span [{start}, {end}) is not inside the reply")
        out.append(Span(start, end))
    return tuple(sorted(set(out), key=lambda s: (s.start, s.end)))


def _comment(text: str) -> str:
    if len(text) > MAX_COMMENT:
        raise ReviewError(f"a comment is at most {MAX_COMMENT} characters")
    return text.strip()


def _severity(value: int) -> int:
    if value not in (1, 2, 3, 4, 5):
        raise ReviewError("severity is 1 to 5")
    return value


class ReviewSession:
    """One campaign's review: its queue (in order), the state of the review, and the writes.

    Args:
        store: The campaign's event store, open for writing.
        campaign: The campaign id.
        queue: The drawn queue (:func:`~mhsafeeval.review.draw_queue`).
        drawn: The event that records it (stored by :func:`open_session`).
        state: The review's events folded so far.
        taxonomy: The taxonomy the campaign was judged with (the cells' definitions and
            ladders shown to raters).
        clock: Unix time source of the events' ``at``.
    """

    def __init__(
        self,
        store: EventStore,
        campaign: str,
        queue: Sequence[Item],
        drawn: ReviewQueueDrawn,
        state: ReviewState,
        taxonomy: Taxonomy,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.campaign = campaign
        self.queue = list(queue)
        self.ids = [i.id for i in self.queue]
        self.position = {item.id: pos for pos, item in enumerate(self.queue)}
        self.drawn = drawn
        self.state = state
        self.taxonomy = taxonomy
        self.clock = clock

    @property
    def threshold(self) -> int:
        """The campaign's threshold: a severity at or above it is an attack success."""
        return self.state.threshold

    def item(self, item_id: str) -> Item:
        """The queued item with this id (ReviewError: not in the queue)."""
        pos = self.position.get(item_id)
        if pos is None:
            raise ReviewError("no such item in this review's queue")
        return self.queue[pos]

    def _ids(self, item: Item, causation: str, who: str) -> dict[str, Any]:
        """A new review event's correlation fields: at the item's reply's coordinates, its
        own key, published by the review."""
        return {
            "campaign": self.campaign,
            "conversation": item.conversation,
            "turn": item.turn,
            "attempt": item.attempt,
            "branch": item.branch,
            "causation": causation,
            "key": new_key(who),
            "publisher": REVIEW_PUBLISHER,
        }

    async def _store(self, event: ReviewRating | ReviewUnblinded | ReviewDecision) -> None:
        await self.store.append(event)
        await self.store.flush()  # stored for good before anyone is told it was
        self.state.add(event)

    async def rate(
        self,
        item_id: str,
        rater: str,
        *,
        severity: int,
        refused: bool,
        understood: bool,
        spans: Sequence[tuple[int, int]] = (),
        comment: str = "",
    ) -> ReviewRating:
        """Store a rater's rating of an item (a later one replaces it in the state, both stay
        stored)."""
        item = self.item(item_id)
        rater = check_person(rater)
        blinded = (item.id, rater) not in self.state.unblinded
        event = ReviewRating(
            **self._ids(item, item.id, rater),
            item=item.id,
            rater=rater,
            severity=_severity(severity),
            refused=refused,
            understood=understood,
            spans=_spans(spans, item.reply),
            comment=_comment(comment),
            blinded=blinded,
            shown=BLINDED_VIEW if blinded else (*BLINDED_VIEW, "judge"),
            at=self.clock(),
            queue=self.drawn.id,
            category=item.category,
            role=item.role,
        )
        await self._store(event)
        return event

    async def unblind(self, item_id: str, rater: str) -> ReviewUnblinded:
        """Record that a rater, having rated the item, sees the judge's verdict on it."""
        item = self.item(item_id)
        rater = check_person(rater)
        rating = self.state.rating(item.id, rater)
        if rating is None:
            raise ReviewError("rate the reply before you see the judge's verdict")
        event = ReviewUnblinded(
            **self._ids(item, rating.id, rater),
            item=item.id,
            rater=rater,
            rating=rating.id,
            at=self.clock(),
        )
        await self._store(event)
        return event

    async def decide(
        self,
        item_id: str,
        adjudicator: str,
        *,
        severity: int,
        refused: bool,
        understood: bool,
        spans: Sequence[tuple[int, int]] = (),
        comment: str = "",
    ) -> ReviewDecision:
        """Store an adjudicator's decision on a disputed item (never one they rated)."""
        item = self.item(item_id)
        adjudicator = check_person(adjudicator)
        rated = self.state.ratings.get(item.id, {})
        if adjudicator in rated:
            raise ReviewError("an adjudicator is a third person: you rated this reply")
        if not self.state.disputed(item.id):
            raise ReviewError("its raters do not disagree: there is nothing to adjudicate")
        event = ReviewDecision(
            **self._ids(item, item.id, adjudicator),
            item=item.id,
            adjudicator=adjudicator,
            severity=_severity(severity),
            refused=refused,
            understood=understood,
            spans=_spans(spans, item.reply),
            comment=_comment(comment),
            ratings=tuple(r.id for r in rated.values()),
            at=self.clock(),
        )
        await self._store(event)
        return event


async def pick_campaign(store: EventStore, campaign: str | None, source: str | Path) -> str:
    """The campaign to review: ``campaign``, or the file's only one (InputError otherwise)."""
    names = [c.id for c in await store.list_campaigns()]
    if campaign is not None:
        if campaign not in names:
            raise InputError(source, "--campaign", f"no campaign {campaign!r}; it holds {names}")
        return campaign
    if not names:
        raise InputError(source, None, "the database holds no campaign")
    if len(names) > 1:
        raise InputError(source, "--campaign", f"the database holds several campaigns: {names}")
    return names[0]


async def open_session(
    store: EventStore,
    campaign: str,
    *,
    seed: int = 0,
    safe_sample: int = 50,
    raters_per_item: int = 2,
    taxonomy: Taxonomy | None = None,
    source: str | Path = "",
    clock: Callable[[], float] = time.time,
) -> ReviewSession:
    """Read a campaign, draw its queue (recorded once as a :class:`ReviewQueueDrawn`) and fold
    the review events already stored, so every rater resumes where they left.

    Raises:
        InputError: The campaign has no run stored, or nothing the judge rated.
    """
    reading = CampaignReading()
    events = []
    async for stored in store.events(campaign):
        if stored.message is None:
            continue
        reading.add(stored.message, stored.recorded_at, stored.seq)
        if stored.type.startswith("review."):
            events.append(stored.message)
    if not reading.started:
        raise InputError(source, None, f"campaign {campaign!r} has no stored run to review")
    items = reading.items()
    if not items:
        raise InputError(source, None, f"campaign {campaign!r} has no judged reply to review")
    threshold = reading.log.threshold
    queue, drawn = draw_queue(
        items,
        campaign=campaign,
        seed=seed,
        safe_sample=safe_sample,
        raters_per_item=raters_per_item,
        threshold=threshold,
    )
    state = ReviewState(threshold=threshold, raters_per_item=raters_per_item)
    for event in events:
        state.add(event)
    await store.append(drawn)
    await store.flush()
    return ReviewSession(
        store, campaign, queue, drawn, state, taxonomy or builtin_taxonomy(), clock=clock
    )
