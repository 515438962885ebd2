"""Ratings carried between copies of a campaign's database: export to JSONL, import back.

Raters may work on copies of one database (one per site, a laptop on a ward); their review
events meet again through a file. :func:`export_ratings` writes every review event of a
campaign, one JSON object per line (:class:`ExportedEvent`: the event as stored, with where
and when it was stored). :func:`import_ratings` checks a whole file before it stores anything
(each line against the schema, each event against the campaign: its replies, their
coordinates, the marked spans inside the reply) and then appends the events that are new.
An event keeps its id across copies (its key is fixed when it is made), so importing a file
twice, or a file holding this copy's own events, stores nothing the second time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

import msgspec

from mhsafeeval._files import open_private_atomic
from mhsafeeval.errors import InputError, read_input, validation_error
from mhsafeeval.framework import encode_message
from mhsafeeval.storage import EventStore

from ._events import (
    REVIEW_EVENTS,
    REVIEW_PUBLISHER,
    ReviewDecision,
    ReviewQueueDrawn,
    ReviewRating,
    ReviewUnblinded,
)
from ._queue import CampaignReading, Item
from ._session import ReviewError, check_person, pick_campaign

__all__ = ["FORMAT", "ExportedEvent", "ImportCounts", "export_ratings", "import_ratings"]

FORMAT: Final = "mhsafeeval-review/1"
"""The ``format`` of every exported line."""

ReviewEvent = ReviewRating | ReviewUnblinded | ReviewDecision | ReviewQueueDrawn


class ExportedEvent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One line of an export: a review event and its provenance."""

    format: Literal["mhsafeeval-review/1"]
    """:data:`FORMAT`: the version of this shape."""
    event: ReviewEvent
    """The event as stored (``type`` its tag; ``rater``, ``at``, ``blinded`` and ``shown``
    say who gave it, when, and what they saw)."""
    id: str = ""
    """The event's id in the store (derived from its type, coordinates, key and publisher)."""
    database: str = ""
    """The file name of the database it was exported from."""
    seq: int = 0
    """Its place in that database's log."""
    recorded_at: float = 0.0
    """Unix time at which that database stored it."""


class ImportCounts(msgspec.Struct, kw_only=True):
    """What an import did."""

    campaign: str
    lines: int = 0
    stored: int = 0
    """Events that were new to the database."""
    present: int = 0
    """Events it already held (left as they were)."""


async def export_ratings(
    store: EventStore,
    path: str | Path,
    campaign: str | None = None,
    *,
    source: str | Path = "",
) -> tuple[str, int]:
    """Write every review event of a campaign to ``path`` (JSONL, replaced atomically, mode
    0600), in stored order; return the campaign and the number of lines.

    Raises:
        InputError: no such campaign, or ``path`` cannot be written.
    """
    name = await pick_campaign(store, campaign, source)
    encoder = msgspec.json.Encoder()
    database = Path(source).name if source else ""
    lines = 0
    with open_private_atomic(path) as out:
        async for stored in store.events(name, types=REVIEW_EVENTS):
            if not isinstance(stored.message, ReviewEvent):
                continue
            line = ExportedEvent(
                format=FORMAT,
                event=stored.message,
                id=stored.id,
                database=database,
                seq=stored.seq,
                recorded_at=stored.recorded_at,
            )
            out.write(encoder.encode(line).decode() + "\n")
            lines += 1
    return name, lines


def _decode(path: str | Path) -> list[tuple[int, ExportedEvent]]:
    """Every line of an export file, checked against the schema."""
    try:
        text = read_input(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, None, f"cannot read the ratings file: {exc}") from None
    decoder = msgspec.json.Decoder(ExportedEvent)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            record = decoder.decode(line)
        except msgspec.ValidationError as exc:
            err = validation_error(None, exc)
            field = f"{where}: {err.field}" if err.field else where
            raise InputError(path, field, err.reason) from None
        except msgspec.DecodeError as exc:
            raise InputError(path, where, f"invalid JSON: {exc}") from None
        out.append((number, record))
    return out


def _check(
    event: ReviewEvent,
    where: str,
    path: str | Path,
    campaign: str,
    items: dict[str, Item],
) -> None:
    """An event that belongs to this campaign's review (InputError naming the field)."""

    def bad(field: str, reason: str) -> InputError:
        return InputError(path, f"{where}: event.{field}", reason)

    if event.campaign != campaign:
        raise bad("campaign", f"{event.campaign!r} is not the campaign {campaign!r}")
    if event.publisher != REVIEW_PUBLISHER:
        raise bad("publisher", f"expected {REVIEW_PUBLISHER!r}, got {event.publisher!r}")
    if isinstance(event, ReviewQueueDrawn):
        unknown = next((i for i in event.items if i not in items), None)
        if unknown is not None:
            raise bad("items", f"{unknown!r} is no reply the campaign's judge rated")
        return
    item = items.get(event.item)
    if item is None:
        raise bad("item", f"{event.item!r} is no reply the campaign's judge rated")
    coordinates = (event.conversation, event.turn, event.attempt, event.branch)
    if coordinates != (item.conversation, item.turn, item.attempt, item.branch):
        raise bad("conversation", "the event is not at its reply's coordinates")
    person = event.adjudicator if isinstance(event, ReviewDecision) else event.rater
    try:
        if check_person(person) != person:
            raise ReviewError("a name has no leading or trailing spaces")
    except ReviewError as exc:
        field = "adjudicator" if isinstance(event, ReviewDecision) else "rater"
        raise bad(field, str(exc)) from None
    if isinstance(event, ReviewRating | ReviewDecision):
        for n, span in enumerate(event.spans):
            if span.end > len(item.reply):
                raise bad(f"spans[{n}]", f"ends at {span.end}, past the reply's {len(item.reply)}")


async def import_ratings(
    store: EventStore,
    path: str | Path,
    campaign: str | None = None,
    *,
    source: str | Path = "",
) -> ImportCounts:
    """Store the review events of an export file in a campaign of ``store``: all of them
    checked first, then those the store does not hold yet.

    Raises:
        InputError: a line that is not an exported review event of this campaign (naming the
            file, the line and the field), an event whose id the store holds with other
            content, no such campaign: nothing is stored then.
    """
    lines = _decode(path)
    name = await pick_campaign(store, campaign, source)
    reading = CampaignReading()
    held: dict[str, bytes] = {}
    async for stored in store.events(name):
        if stored.message is None:
            continue
        reading.add(stored.message, stored.recorded_at, stored.seq)
        if stored.type in REVIEW_EVENTS:
            held[stored.id] = encode_message(stored.message)
    if not reading.started:
        raise InputError(source, None, f"campaign {name!r} has no stored run")
    items = {item.id: item for item in reading.items()}
    counts = ImportCounts(campaign=name, lines=len(lines))
    new: dict[str, ReviewEvent] = {}
    for number, record in lines:
        where = f"line {number}"
        event = record.event
        _check(event, where, path, name, items)
        if record.id and record.id != event.id:
            raise InputError(path, f"{where}: id", "is not the id of the event on that line")
        body = encode_message(event)
        known = held.get(event.id)
        if known is None and event.id in new:
            known = encode_message(new[event.id])
        if known is not None and known != body:
            raise InputError(
                path, f"{where}: event", "the database holds another event under its id"
            )
        if event.id in held:
            counts.present += 1
        elif event.id not in new:
            new[event.id] = event
    for event in new.values():
        await store.append(event)
    await store.flush()
    counts.stored = len(new)
    return counts
