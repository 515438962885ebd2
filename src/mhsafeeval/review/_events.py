"""The review's events: what people said about the judge's verdicts, stored beside them.

A person's rating never edits a :class:`~mhsafeeval.messages.Verdict`: it is a new event in the
campaign's own store, at the rated reply's coordinates, caused by the verdict it rates
(``causation``), with who rated it, when, and what the page showed them. A rater who changes
their mind stores a second rating; the latest one of each rater counts. Tags are a stored
schema, as in :mod:`mhsafeeval.messages`: never renamed or reused; new fields get defaults.

This module needs only msgspec and the framework's :class:`~mhsafeeval.framework.Message`, so a
reader of the store can import it cheaply to decode these events.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

import msgspec

from mhsafeeval.framework import Message

__all__ = [
    "REVIEW_EVENTS",
    "REVIEW_PUBLISHER",
    "ItemKind",
    "ReviewDecision",
    "ReviewQueueDrawn",
    "ReviewRating",
    "ReviewUnblinded",
    "Span",
    "new_key",
]

REVIEW_PUBLISHER = "review"
"""The ``publisher`` of every review event (no graph node publishes it: the workbench does)."""

ItemKind = Literal["finding", "unconfirmed", "candidate", "safe"]
"""What the judge made of a queued reply: ``finding`` (at or above the threshold, confirmed
where the campaign confirms), ``unconfirmed`` (a candidate the confirmation turned down),
``candidate`` (at or above the threshold, its confirmation never stored) or ``safe`` (below the
threshold). Never shown to a blinded rater."""

Severity = Annotated[int, msgspec.Meta(ge=1, le=5)]
Offset = Annotated[int, msgspec.Meta(ge=0)]


class Span(msgspec.Struct, frozen=True, array_like=True):
    """Characters ``start`` (included) to ``end`` (excluded) of the reply, counted in Unicode
    code points (Python's ``len``), that carry the harm."""

    start: Offset
    end: Offset

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"a span must end after it starts, got [{self.start}, {self.end})")


def new_key(who: str) -> str:
    """A fresh ``key`` for one person's event: each rating is its own fact, never a duplicate
    of an earlier one (a stored event keeps its key, so importing it again is a no-op)."""
    return f"{who}:{uuid.uuid4().hex}"


class ReviewRating(Message, frozen=True, kw_only=True, tag="review.rating"):
    """One person's rating of one reply, as they gave it.

    At the rated reply's coordinates, ``causation`` the rated verdict's id (also ``item``),
    ``key`` from :func:`new_key`, ``publisher`` :data:`REVIEW_PUBLISHER`.
    """

    record = True

    item: str
    """The rated reply's verdict id (the queue's item id)."""
    rater: str
    severity: Severity
    refused: bool
    understood: bool
    spans: tuple[Span, ...] = ()
    comment: str = ""
    blinded: bool = True
    """The page showed no judge's severity, label or reasoning (False: this rater had
    unblinded the item before rating it again)."""
    shown: tuple[str, ...] = ()
    """What the page showed: ``cell``, ``ladder``, ``history``, ``utterance``, ``reply``, and
    ``judge`` when not blinded."""
    at: float
    """Unix time at which the workbench received it."""
    queue: str = ""
    """The id of the :class:`ReviewQueueDrawn` the item was drawn in."""
    category: str = ""
    role: str = ""


class ReviewUnblinded(Message, frozen=True, kw_only=True, tag="review.unblinded"):
    """A rater, after rating, asked to see the judge's verdict on the item."""

    record = True

    item: str
    rater: str
    rating: str
    """The id of the rater's rating in force when they unblinded."""
    at: float


class ReviewDecision(Message, frozen=True, kw_only=True, tag="review.decision"):
    """An adjudicator's decision on an item whose raters disagreed; it never edits them."""

    record = True

    item: str
    adjudicator: str
    severity: Severity
    refused: bool
    understood: bool
    spans: tuple[Span, ...] = ()
    comment: str = ""
    ratings: tuple[str, ...] = ()
    """The ids of the ratings the adjudicator was shown."""
    blinded: bool = True
    """The adjudicator saw the raters' ratings, not the judge's verdict."""
    at: float


class ReviewQueueDrawn(Message, frozen=True, kw_only=True, tag="review.queue"):
    """A review queue as drawn: its parameters and items in order, so that anyone can check
    which replies were sampled and draw the same queue again. Drawn again with the same
    parameters and the same campaign, it has the same id, so it is stored once."""

    record = True

    seed: int
    safe_sample: int
    raters_per_item: int
    threshold: int
    items: tuple[str, ...]
    kinds: dict[str, int] = {}
    """How many items of each :data:`ItemKind`."""


REVIEW_EVENTS: tuple[str, ...] = tuple(
    kind.tag_name() for kind in (ReviewRating, ReviewUnblinded, ReviewDecision, ReviewQueueDrawn)
)
"""The tags of the review's events (what a reader of a campaign asks the store for)."""
