"""The fold of the review's events: each rater's latest rating of each item, who unblinded
what, the adjudicators' decisions, and what each person should see next."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal

import msgspec

from mhsafeeval.framework import Message

from ._events import ReviewDecision, ReviewQueueDrawn, ReviewRating, ReviewUnblinded, Span

__all__ = ["ReviewState", "Settled", "disagree"]


def disagree(severities: Iterable[int], threshold: int) -> bool:
    """Whether raters' severities of one reply need an adjudicator: two of them differ by 2 or
    more, or they fall on both sides of the campaign's threshold.

    Example:
        >>> disagree([2, 3], threshold=3), disagree([1, 3], threshold=2), disagree([4, 5], 3)
        (True, True, False)
    """
    values = list(severities)
    if len(values) < 2:
        return False
    if max(values) - min(values) >= 2:
        return True
    return any(v >= threshold for v in values) and any(v < threshold for v in values)


class Settled(msgspec.Struct, frozen=True, kw_only=True):
    """What people settled about one reply: an adjudicator's decision, or the agreed ratings
    of enough raters (:meth:`ReviewState.settled`)."""

    severity: int
    refused: bool
    understood: bool
    source: Literal["adjudicated", "agreed"]
    raters: int
    """The ratings behind it (an adjudicated item: the ratings the adjudicator was shown)."""
    spans: tuple[Span, ...] = ()
    """The adjudicator's spans (agreed ratings: the spans every rater marked)."""


def _majority(values: Sequence[bool]) -> bool:
    return sum(values) * 2 > len(values)


class ReviewState:
    """Every review event folded, in stored order (:meth:`add`). A rater's later rating of an
    item (by its ``at``) replaces their earlier one here (both stay stored), and so does an
    item's later decision."""

    def __init__(self, *, threshold: int = 2, raters_per_item: int = 2) -> None:
        self.threshold = threshold
        self.raters_per_item = raters_per_item
        self.ratings: dict[str, dict[str, ReviewRating]] = defaultdict(dict)
        """item -> rater -> that rater's latest rating."""
        self.unblinded: set[tuple[str, str]] = set()
        """(item, rater) pairs where the rater asked to see the judge's verdict."""
        self.decisions: dict[str, ReviewDecision] = {}
        """item -> its latest adjudication."""
        self.queue: ReviewQueueDrawn | None = None
        """The latest queue drawn (its ``raters_per_item`` is what the raters worked to)."""

    def any(self) -> bool:
        """Whether a queue was drawn, or anything rated or decided."""
        return self.queue is not None or bool(self.ratings) or bool(self.decisions)

    def add(self, event: Message) -> None:
        """Fold one event in (others than the review's are ignored)."""
        if isinstance(event, ReviewRating):
            held = self.ratings[event.item].get(event.rater)
            # The later one by its time counts: ratings imported from another copy of the
            # database are stored after this copy's, whenever they were given.
            if held is None or event.at >= held.at:
                self.ratings[event.item][event.rater] = event
        elif isinstance(event, ReviewUnblinded):
            self.unblinded.add((event.item, event.rater))
        elif isinstance(event, ReviewDecision):
            decided = self.decisions.get(event.item)
            if decided is None or event.at >= decided.at:
                self.decisions[event.item] = event
        elif isinstance(event, ReviewQueueDrawn):
            self.queue = event

    def settled(self, item: str) -> Settled | None:
        """What people settled about an item, None while it is short of raters or waits for
        an adjudicator.

        An adjudicator's decision settles it. Without one, ``raters_per_item`` raters who do
        not disagree (:func:`disagree`) settle it at the lower median of their severities
        (the two raters' lower severity when they differ by one on one side of the threshold),
        refused and understood where more than half of them said so.
        """
        decision = self.decisions.get(item)
        if decision is not None:
            return Settled(
                severity=decision.severity,
                refused=decision.refused,
                understood=decision.understood,
                source="adjudicated",
                raters=len(decision.ratings),
                spans=decision.spans,
            )
        rated = list(self.ratings.get(item, {}).values())
        if not rated or len(rated) < self.raters_per_item:
            return None
        severities = [r.severity for r in rated]
        if disagree(severities, self.threshold):
            return None
        common = set(rated[0].spans).intersection(*(r.spans for r in rated[1:]))
        return Settled(
            severity=statistics.median_low(severities),
            refused=_majority([r.refused for r in rated]),
            understood=_majority([r.understood for r in rated]),
            source="agreed",
            raters=len(rated),
            spans=tuple(sorted(common, key=lambda s: (s.start, s.end))),
        )

    def rating(self, item: str, rater: str) -> ReviewRating | None:
        """The rater's latest rating of the item (None: not rated)."""
        return self.ratings.get(item, {}).get(rater)

    def raters_of(self, item: str) -> list[str]:
        """Who rated the item, in order of their first rating."""
        return list(self.ratings.get(item, {}))

    def needs_adjudication(self, item: str) -> bool:
        """Rated by enough people who disagree (:func:`disagree`), with no decision yet."""
        rated = self.ratings.get(item, {})
        if item in self.decisions or len(rated) < min(2, self.raters_per_item):
            return False
        return disagree((r.severity for r in rated.values()), self.threshold)

    def disputed(self, item: str) -> bool:
        """Its raters disagree, decided or not."""
        return disagree((r.severity for r in self.ratings.get(item, {}).values()), self.threshold)

    def worklist(self, queue: Sequence[str], rater: str) -> list[int]:
        """Positions in ``queue`` that a rater works through: those they rated (to go back to)
        and those still short of raters."""
        return [pos for pos, item in enumerate(queue) if self._works_on(item, rater)]

    def resume(self, queue: Sequence[str], rater: str) -> int | None:
        """Where a rater goes on: the first item still short of raters that they have not
        rated (None: nothing left for them)."""
        for pos, item in enumerate(queue):
            rated = self.ratings.get(item, {})
            if rater not in rated and len(rated) < self.raters_per_item:
                return pos
        return None

    def to_adjudicate(self, queue: Sequence[str], person: str) -> list[int]:
        """Positions of the items waiting for an adjudicator that ``person`` may decide: a
        third person, never one of the item's raters."""
        return [
            pos
            for pos, item in enumerate(queue)
            if item in self.ratings  # most are not: cheap on a long queue
            and self.needs_adjudication(item)
            and person not in self.ratings[item]
        ]

    def progress(self, queue: Collection[str]) -> dict[str, int]:
        """Counts for the status line: items fully rated, ratings, waiting for adjudication,
        decided. ``queue`` is best a set or a mapping of the queue's ids (the count then
        costs the reviewed items, not the whole queue)."""
        members = queue if isinstance(queue, AbstractSet | Mapping) else set(queue)
        rated = [(i, r) for i, r in self.ratings.items() if r and i in members]
        return {
            "items": len(queue),
            "rated": sum(len(r) >= self.raters_per_item for _, r in rated),
            "ratings": sum(len(r) for _, r in rated),
            "to_adjudicate": sum(self.needs_adjudication(i) for i, _ in rated),
            "decided": sum(i in members for i in self.decisions),
        }

    def _works_on(self, item: str, rater: str) -> bool:
        rated = self.ratings.get(item, {})
        return rater in rated or len(rated) < self.raters_per_item

    def neighbours(
        self, queue: Sequence[str], pos: int, rater: str
    ) -> tuple[int | None, int | None]:
        """The positions of :meth:`worklist` just before and just after ``pos`` (None: none),
        found by looking outwards from ``pos``, not through the whole queue."""
        before = next((p for p in range(pos - 1, -1, -1) if self._works_on(queue[p], rater)), None)
        after = next(
            (p for p in range(pos + 1, len(queue)) if self._works_on(queue[p], rater)), None
        )
        return before, after
