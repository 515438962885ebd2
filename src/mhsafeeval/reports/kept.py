"""A campaign's report kept in its database, so an unchanged campaign is not folded again.

Folding a campaign's events is what a report costs (about 1.2 ms of CPU per conversation;
12 s at 10,000 conversations), and its figures are a function of the events and of the code
that folds them, nothing else: the bootstraps are seeded. So the report is kept in the store
(:meth:`~mhsafeeval.storage.EventStore.put_summary`, kind ``"report"``, MessagePack) under a
key naming both:

- the code: a hash of every module of the installed ``mhsafeeval`` (:func:`code_fingerprint`);
  another version, or an edited checkout, folds again;
- the log: the campaign's committed events, its newest ``seq`` and its superseded events
  (:func:`log_position`). Any event stored since (a resumed run, ``rejudge``, a review's
  ratings) changes it.

A kept report whose key is not the reader's own is never used, and nothing but the key decides:
a reader with ``refold=True`` (``report --refold``) folds every event and shows the same
figures. ``run`` keeps the report it prints; ``report`` keeps what it had to fold when it can
write the file (no campaign running on it); a read-only file is read as before.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from mhsafeeval.errors import MhSafeEvalError
from mhsafeeval.reports.text import CampaignReport, load_reports_and_logs, wanted_campaigns

if TYPE_CHECKING:
    from mhsafeeval.storage import EventStore

__all__ = [
    "HTML_KIND",
    "KIND",
    "Fresh",
    "code_fingerprint",
    "keep",
    "keep_in_file",
    "kept_body",
    "load_kept",
    "log_position",
]

KIND = "report"
"""The kind of summary a report is kept under."""
HTML_KIND = "html"
"""The kind of summary a campaign's part of the HTML report is kept under
(:mod:`mhsafeeval.reports.html`: with its pages of transcripts, compressed)."""

_DECODER = msgspec.msgpack.Decoder(CampaignReport)  # msgpack: NaN and tuples round-trip


@cache
def code_fingerprint() -> str:
    """A hash of every Python module of the installed package (path and bytes): what folds
    the events. About 1.3 MB read once per process."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


async def log_position(store: EventStore, campaign: str) -> str:
    """What a kept report of ``campaign`` must have been folded from: the code and the log as
    it is now (flush a store you write to first)."""
    count = await store.count(campaign)
    last = await store.last_seq(campaign)
    superseded = await store.superseded(campaign)
    return f"code {code_fingerprint()}; events {count}; last {last}; superseded {superseded}"


async def kept_body(store: EventStore, campaign: str, kind: str, key: str) -> bytes | None:
    """The body of the summary of ``kind`` kept for exactly ``key`` (None: none, or another's)."""
    summary = await store.summary(campaign, kind)
    return None if summary is None or summary.key != key else summary.body


async def _kept(store: EventStore, campaign: str, position: str) -> CampaignReport | None:
    """The report kept for exactly ``position``, or None."""
    body = await kept_body(store, campaign, KIND, position)
    if body is None:
        return None
    try:
        return _DECODER.decode(body)
    except msgspec.MsgspecError:  # written by other code under the same key: fold again
        return None


Fresh = dict[str, tuple[str, bytes]]
"""Per campaign, a summary folded here to keep: its key and its body."""


async def load_kept(
    store: EventStore,
    campaign: str | None = None,
    *,
    source: str | Path | None = None,
    refold: bool = False,
) -> tuple[list[CampaignReport], Fresh]:
    """Each stored campaign's report (or just ``campaign``'s), as
    :func:`~mhsafeeval.reports.text.load_report` folds it, read from the store where a report
    of the same code and log was kept.

    Returns:
        The reports, and those folded here with the position they were folded at
        (:func:`log_position`): what :func:`keep` keeps. ``refold``: every report is folded
        and none is offered for keeping.

    Raises:
        InputError: no such campaign (``source`` names the database).
    """
    reports: list[CampaignReport] = []
    fresh: Fresh = {}
    for name in await wanted_campaigns(store, campaign, source):
        position = await log_position(store, name)
        report = None if refold else await _kept(store, name, position)
        if report is None:
            [(report, _)] = await load_reports_and_logs(store, name, source=source, whole=False)
            if not refold:
                fresh[name] = (position, msgspec.msgpack.encode(report))
        reports.append(report)
    return reports, fresh


async def keep(store: EventStore, kind: str, fresh: Fresh) -> None:
    """Keep each fresh summary under its key."""
    for name, (key, body) in fresh.items():
        await store.put_summary(name, kind, key, body)


async def keep_in_file(path: str | os.PathLike[str], kind: str, fresh: Fresh) -> str | None:
    """:func:`keep` into the database file at ``path``, opened for writing just for that;
    nothing happens when it cannot be (returns why): a campaign running on it, a file or
    folder this user may not write. For summaries folded through a read-only store."""
    if not fresh:
        return None
    import sqlite3

    from mhsafeeval.storage import SqliteEventStore

    if not os.access(path, os.W_OK) or not os.access(Path(path).parent, os.W_OK):
        return "the database or its folder is read-only"
    try:
        async with SqliteEventStore(path) as store:
            await keep(store, kind, fresh)
    except (MhSafeEvalError, OSError, sqlite3.Error) as exc:  # a running campaign's lock, say
        return str(exc)
    return None
