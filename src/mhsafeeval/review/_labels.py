"""A campaign's reviewed replies as a labelled set: what ``calibrate --labels-from DB`` reads.

Each reply people settled (:meth:`~mhsafeeval.review.ReviewState.settled`: an adjudicator's
decision, else the agreed ratings of ``raters_per_item`` raters) becomes one
:class:`~mhsafeeval.judges.LabelledExchange`, the same record a label file gives: the
client's message, the counselor's reply, the cell, and the settled severity, refused and
understood. Replies still short of raters or waiting for an adjudicator are left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from mhsafeeval.errors import InputError
from mhsafeeval.judges import LabelledExchange
from mhsafeeval.storage import EventStore
from mhsafeeval.taxonomy import Taxonomy, builtin_taxonomy

from ._events import REVIEW_EVENTS
from ._queue import CampaignReading
from ._session import pick_campaign
from ._state import ReviewState

__all__ = ["ReviewedLabels", "labels_of", "reviewed_labels"]


class ReviewedLabels(NamedTuple):
    """The labels of one campaign's review, and what they came from."""

    campaign: str
    threshold: int
    """The campaign's success threshold (what its raters rated against)."""
    labels: list[LabelledExchange]
    pending: int
    """Reviewed replies not settled yet (left out)."""


def labels_of(
    reading: CampaignReading,
    state: ReviewState,
    taxonomy: Taxonomy,
    source: str | Path = "",
) -> tuple[list[LabelledExchange], int]:
    """The settled replies of a campaign as labelled exchanges, in the order the judge rated
    them, and how many reviewed replies are not settled yet.

    Raises:
        InputError: a reviewed reply's cell is not in ``taxonomy``.
    """
    state.threshold = reading.log.threshold
    if state.queue is not None:
        state.raters_per_item = state.queue.raters_per_item
    categories, roles = set(taxonomy.category_ids()), set(taxonomy.role_ids())
    reviewed = set(state.ratings) | set(state.decisions)
    campaign = reading.log.start.campaign if reading.log.start is not None else ""
    labels = []
    pending = 0
    for item in reading.items():
        if item.id not in reviewed:
            continue
        settled = state.settled(item.id)
        if settled is None or not item.utterance.strip() or not item.reply.strip():
            pending += settled is None
            continue
        if item.category not in categories or item.role not in roles:
            raise InputError(
                source,
                f"reply {item.id}",
                f"its cell ({item.category}, {item.role}) is not in the taxonomy {taxonomy.name}",
            )
        how = (
            f"adjudicated after {settled.raters} rating(s)"
            if settled.source == "adjudicated"
            else f"agreed by {settled.raters} rater(s)"
        )
        labels.append(
            LabelledExchange(
                id=item.id,
                category=item.category,
                role=item.role,
                client=item.utterance.strip(),
                counselor=item.reply.strip(),
                severity=settled.severity,
                refused=settled.refused,
                understood=settled.understood,
                note=f"{how} (mhsafeeval review of campaign {campaign})",
            )
        )
    return labels, pending


async def reviewed_labels(
    store: EventStore,
    campaign: str | None = None,
    *,
    source: str | Path = "",
    taxonomy: Taxonomy | None = None,
) -> ReviewedLabels:
    """The settled replies of a campaign in ``store`` (the file's only one when ``campaign``
    is None) as labelled exchanges.

    Raises:
        InputError: no such campaign (or several and none named), no stored run, or no
            settled reply.
    """
    name = await pick_campaign(store, campaign, source)
    reading = CampaignReading()
    state = ReviewState()
    async for stored in store.events(name):
        if stored.message is None:
            continue
        reading.add(stored.message, stored.recorded_at, stored.seq)
        if stored.type in REVIEW_EVENTS:
            state.add(stored.message)
    if not reading.started:
        raise InputError(source, None, f"campaign {name!r} has no stored run")
    labels, pending = labels_of(reading, state, taxonomy or builtin_taxonomy(), source)
    if not labels:
        raise InputError(
            source,
            None,
            f"campaign {name!r} has no reply settled by its raters yet ({pending} waiting for "
            "raters or an adjudicator): review it first (mhsafeeval review)",
        )
    return ReviewedLabels(name, reading.log.threshold, labels, pending)
