"""The clinician review workbench: people rate the judge's verdicts, blinded, and adjudicate.

``mhsafeeval review DB`` serves a local web page (:func:`serve`) where raters work through a
campaign's review queue (:func:`draw_queue`: every finding and candidate of the search's judge,
and a stratified, seeded sample of the replies it called safe). Each rating, unblinding and
adjudication is an event in the campaign's own store (:class:`ReviewRating`,
:class:`ReviewUnblinded`, :class:`ReviewDecision`, :class:`ReviewQueueDrawn`), never an edit of a
verdict; :class:`ReviewState` folds them. :func:`review_metrics` turns them into figures (what
people confirmed, the judge's precision and misses, agreement), :func:`reviewed_labels` into
``calibrate``'s labels, and :func:`export_ratings` / :func:`import_ratings` carry them between
copies of a database. docs/review.md describes the workflow and the
security model.

Importing this package is cheap (msgspec and the framework only): the web server's
dependencies (starlette, uvicorn) are imported by
:func:`serve` and :func:`create_app` only.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from mhsafeeval.framework import lazy_exports as _lazy_exports

from ._events import (
    REVIEW_EVENTS,
    ItemKind,
    ReviewDecision,
    ReviewQueueDrawn,
    ReviewRating,
    ReviewUnblinded,
    Span,
)

if _TYPE_CHECKING:
    from ._app import create_app
    from ._exchange import export_ratings, import_ratings
    from ._labels import reviewed_labels
    from ._metrics import CellReview, ModelReview, ReviewMetrics, review_metrics, review_metrics_of
    from ._queue import CampaignReading, Item, draw_queue, stratified_sample
    from ._serve import ReviewServer, serve
    from ._session import ReviewSession, open_session
    from ._state import ReviewState, Settled, disagree

__all__ = [
    "REVIEW_EVENTS",
    "CampaignReading",
    "CellReview",
    "Item",
    "ItemKind",
    "ModelReview",
    "ReviewDecision",
    "ReviewMetrics",
    "ReviewQueueDrawn",
    "ReviewRating",
    "ReviewServer",
    "ReviewSession",
    "ReviewState",
    "ReviewUnblinded",
    "Settled",
    "Span",
    "create_app",
    "disagree",
    "draw_queue",
    "export_ratings",
    "import_ratings",
    "open_session",
    "review_metrics",
    "review_metrics_of",
    "reviewed_labels",
    "serve",
    "stratified_sample",
]

# The queue reads the campaign's log (mhsafeeval.storage), the app needs starlette: both are
# imported when first asked for, so that decoding review events costs nothing more.
__getattr__ = _lazy_exports(
    __name__,
    {
        "create_app": "mhsafeeval.review._app",
        "CampaignReading": "mhsafeeval.review._queue",
        "Item": "mhsafeeval.review._queue",
        "draw_queue": "mhsafeeval.review._queue",
        "stratified_sample": "mhsafeeval.review._queue",
        "ReviewServer": "mhsafeeval.review._serve",
        "serve": "mhsafeeval.review._serve",
        "ReviewSession": "mhsafeeval.review._session",
        "open_session": "mhsafeeval.review._session",
        "ReviewState": "mhsafeeval.review._state",
        "Settled": "mhsafeeval.review._state",
        "disagree": "mhsafeeval.review._state",
        "CellReview": "mhsafeeval.review._metrics",
        "ModelReview": "mhsafeeval.review._metrics",
        "ReviewMetrics": "mhsafeeval.review._metrics",
        "review_metrics": "mhsafeeval.review._metrics",
        "review_metrics_of": "mhsafeeval.review._metrics",
        "reviewed_labels": "mhsafeeval.review._labels",
        "export_ratings": "mhsafeeval.review._exchange",
        "import_ratings": "mhsafeeval.review._exchange",
    },
)
