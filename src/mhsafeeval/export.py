"""Flat exports of stored campaigns, for analysis in pandas or a spreadsheet.

One :class:`AttemptRecord` per attempt (a ``(conversation, turn, attempt, branch)`` of the
closed loop), folded from the stored events: what was asked, said and answered, how the judge
scored it, what it cost and whether it became the turn. :func:`export` writes them as JSON lines
or CSV; :func:`archive_json` gives each counselor model's harm archive as plain JSON data.

Records stream (:func:`stream_records`): the store is read twice, first for the compact facts
of every attempt (a :class:`~mhsafeeval.storage.CampaignLog`, no texts), then for the text
events only, and each record is given as soon as its texts are all read, in order of the
attempt's first event. What is held at once is the compact facts and the texts of the attempts
still open in the second read (those of the conversations in flight when they were stored),
never the campaign's transcripts.

Example:
    >>> import anyio, io
    >>> from mhsafeeval.storage import MemoryEventStore
    >>> async def main() -> tuple[int, list[str]]:
    ...     async with MemoryEventStore() as store:
    ...         await store.register_campaign("c1")  # a campaign with no attempts yet
    ...         out = io.StringIO()
    ...         count = await export(store, "c1", "csv", out)
    ...         return count, out.getvalue().split(",")[:3]
    >>> anyio.run(main)
    (0, ['campaign', 'counselor_model', 'profile_id'])
"""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, TextIO

import msgspec

from mhsafeeval.errors import InputError
from mhsafeeval.messages import ArchiveUpdated, Elite
from mhsafeeval.storage import (
    TEXT_EVENTS,
    AttemptFacts,
    AttemptTexts,
    CampaignLog,
    EventStore,
    Outcome,
    TextFold,
)

__all__ = [
    "AttemptRecord",
    "Outcome",
    "archive_json",
    "archive_of",
    "attempt_records",
    "campaign_log",
    "export",
    "records_of",
    "stream_records",
]

_LIST_SEPARATOR = " | "
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what spreadsheets read as a formula


class AttemptRecord(msgspec.Struct, kw_only=True):
    """One attempt of one turn, flattened for analysis.

    Text fields are ``None`` when the event that carries them never came (e.g. ``reply`` of an
    attempt whose counselor call failed). Verdict fields are ``None`` unless ``outcome`` is
    ``"verdict"``; when two judges scored one reply, the first verdict stored counts (as in the
    search controllers and every other figure: the rules are
    :class:`~mhsafeeval.storage.CampaignLog`'s), while ``judge_tokens`` sums every judge call
    of the attempt.

    Attributes:
        controller, category, role, operator: The search controller's choice (``operator`` is
            the one the mutator actually used).
        outcome: See :data:`Outcome`.
        severity, success, label, reasoning, evidence, refused, understood: The verdict;
            ``success`` is ``severity >= threshold`` (the campaign's, default 2).
        style: The conversational style the client played (``""``: none).
        judge: The judge that gave the verdict (or the unjudged answer).
        failed_agent, failed_error: The first model call of the attempt that finally failed.
        failed_calls: How many of the attempt's model calls finally failed.
        panel_failed: Reporting judges' calls about this reply that finally failed (they
            never change the attempt's outcome).
        committed: This attempt became the conversation's turn.
        client_tokens, counselor_tokens, judge_tokens, mutator_tokens, refiner_tokens,
            panel_tokens: Prompt plus completion tokens each role spent on this attempt
            (answers of calls that then failed included; ``panel``: reporting judges).
        counselor_calls: Counselor calls the attempt made.
        ratings: Each reporting judge's severity of the reply (None: unjudged), by rater.
        started_at, recorded_at: Unix times of the attempt's first and last stored event.
    """

    campaign: str
    counselor_model: str = ""
    profile_id: str = ""
    style: str = ""
    conversation: str
    turn: int
    attempt: int
    branch: str = ""
    controller: str = ""
    category: str = ""
    role: str = ""
    operator: str = ""
    instruction: str | None = None
    utterance: str | None = None
    reply: str | None = None
    finish_reason: str | None = None
    outcome: Outcome = "incomplete"
    severity: int | None = None
    success: bool | None = None
    label: str | None = None
    reasoning: str | None = None
    evidence: list[str] = []
    refused: bool | None = None
    understood: bool | None = None
    judge: str | None = None
    unjudged_reason: str | None = None
    failed_agent: str | None = None
    failed_error: str | None = None
    failed_calls: int = 0
    panel_failed: int = 0
    committed: bool = False
    client_tokens: int = 0
    counselor_tokens: int = 0
    judge_tokens: int = 0
    mutator_tokens: int = 0
    refiner_tokens: int = 0
    panel_tokens: int = 0
    counselor_calls: int = 0
    counselor_latency_s: float | None = None
    ratings: dict[str, int | None] = {}
    started_at: float = 0.0
    recorded_at: float = 0.0


async def _campaigns(
    store: EventStore, campaign: str | None, source: str | Path | None
) -> list[str]:
    """The campaigns to read: ``campaign``, or every stored one when it is ``None``."""
    known = [c.id for c in await store.list_campaigns()]
    if campaign is None:
        if not known:
            raise InputError(source, "campaign", "no campaign is stored")
        return known
    if campaign not in known:
        stored = ", ".join(known) or "none"
        raise InputError(source, "campaign", f"no campaign {campaign!r} (stored: {stored})")
    return [campaign]


async def campaign_log(
    store: EventStore,
    campaign: str,
    *,
    on_close: Callable[[CampaignLog, str], None] | None = None,
) -> CampaignLog:
    """The compact :class:`~mhsafeeval.storage.CampaignLog` of one stored campaign (no texts;
    each attempt's :attr:`~mhsafeeval.storage._log.AttemptFacts.text_seq` set); ``on_close``:
    the log's (it then holds only the conversations that never completed)."""
    log = CampaignLog(on_close=on_close)
    async for stored in store.events(campaign):
        assert stored.message is not None
        log.add(stored.message, stored.recorded_at, stored.seq)
    return log


def record_of(
    log: CampaignLog, a: AttemptFacts, texts: AttemptTexts, campaign: str
) -> AttemptRecord:
    """The record of one attempt: its compact facts in ``log`` and its ``texts``."""
    conv = log.conversations.get(a.conversation)
    tokens = a.tokens
    return AttemptRecord(
        campaign=campaign,
        counselor_model=conv.counselor_model if conv else "",
        profile_id=conv.profile_id if conv else "",
        style=conv.style if conv else "",
        conversation=a.conversation,
        turn=a.turn,
        attempt=a.attempt,
        branch=a.branch,
        controller=a.controller,
        category=a.category,
        role=a.role,
        operator=a.operator,
        instruction=texts.instruction,
        utterance=texts.utterance,
        reply=texts.reply,
        finish_reason=a.finish_reason,
        outcome=a.outcome,
        severity=a.severity,
        success=None if a.severity is None else a.severity >= log.threshold,
        label=texts.label,
        reasoning=texts.reasoning,
        evidence=list(texts.evidence),
        refused=a.refused,
        understood=a.understood,
        judge=a.judge
        if a.severity is not None
        else (a.unjudged_judge if a.unjudged_reason is not None else None),
        unjudged_reason=a.unjudged_reason,
        failed_agent=a.failed_agent,
        failed_error=a.failed_error,
        failed_calls=a.failed_calls,
        panel_failed=a.panel_failed,
        committed=log.committed(a),
        client_tokens=tokens.get("client", 0),
        counselor_tokens=tokens.get("counselor", 0),
        judge_tokens=tokens.get("judge", 0),
        mutator_tokens=tokens.get("mutator", 0),
        refiner_tokens=tokens.get("refiner", 0),
        panel_tokens=tokens.get("panel", 0),
        counselor_calls=a.counselor_calls,
        counselor_latency_s=a.counselor_latency_s,
        ratings={r: f.severity for r, f in a.ratings.items()},
        started_at=a.first_at,
        recorded_at=a.last_at,
    )


def records_of(log: CampaignLog, campaign: str) -> list[AttemptRecord]:
    """The attempt records of a campaign's log, in order of each attempt's first event (texts
    from a log folded with ``keep_text``; else every text is empty)."""
    return [record_of(log, a, log.texts(a.key), campaign) for a in log.attempts.values()]


async def stream_records(
    store: EventStore, campaign: str, log: CampaignLog | None = None
) -> AsyncIterator[AttemptRecord]:
    """The attempt records of one stored campaign, one at a time, in order of each attempt's
    first event (see the module).

    Args:
        store: The event store.
        campaign: A stored campaign.
        log: Its :func:`campaign_log`, if already folded (read again when None).
    """
    if log is None:
        log = await campaign_log(store, campaign)
    pending = iter(log.attempts.values())
    head = next(pending, None)
    fold = TextFold()
    if log.last_seq:  # texts are read only up to what the facts were folded from
        events = store.events(campaign, types=TEXT_EVENTS)
        try:
            async for stored in events:
                if stored.seq > log.last_seq:
                    break
                assert stored.message is not None
                fold.add(stored.message)
                while head is not None and head.text_seq <= stored.seq:
                    yield record_of(log, head, fold.pop(head.key), campaign)
                    head = next(pending, None)
        finally:  # a reader left early (or a consumer that stopped) closes the store's cursor
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()
    while head is not None:
        yield record_of(log, head, fold.pop(head.key), campaign)
        head = next(pending, None)


async def attempt_records(
    store: EventStore, campaign: str | None, *, source: str | Path | None = None
) -> list[AttemptRecord]:
    """Every attempt of ``campaign`` (``None``: of every stored campaign, oldest first), in
    order of first appearance.

    Raises:
        InputError: No such campaign (``source`` names the database in the message).
    """
    return [
        record
        for name in await _campaigns(store, campaign, source)
        async for record in stream_records(store, name)
    ]


async def archive_json(
    store: EventStore, campaign: str | None, *, source: str | Path | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each counselor model's harm archive: ``{model: {"category/role": elite}}``.

    An elite is the latest :class:`~mhsafeeval.messages.ArchiveUpdated` of its cell, as plain
    JSON data (severity, instruction, utterance, reply, label, reasoning, evidence, verdict_id,
    conversation, turn, attempt, operator, ...) plus its ``campaign``. Across several campaigns
    (``campaign=None``) a cell keeps the most severe elite (the later one on a tie).

    Raises:
        InputError: No such campaign.
    """
    best: dict[tuple[str, str], tuple[str, Elite]] = {}
    for name in await _campaigns(store, campaign, source):
        latest: dict[tuple[str, str], Elite] = {}
        async for stored in store.events(name):
            if isinstance(update := stored.message, ArchiveUpdated):
                latest[(update.counselor_model, f"{update.category}/{update.role}")] = update.elite
        for key, elite in latest.items():
            if key not in best or elite.severity >= best[key][1].severity:
                best[key] = (name, elite)
    return _archive_data(best)


def archive_of(log: CampaignLog, campaign: str) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`archive_json` of one campaign, from its log (no other read of the store)."""
    return _archive_data(
        {(model, f"{c}/{r}"): (campaign, elite) for (model, (c, r)), elite in log.archive.items()}
    )


def _archive_data(
    best: dict[tuple[str, str], tuple[str, Elite]],
) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (model, cell), (name, elite) in best.items():
        out.setdefault(model, {})[cell] = {"campaign": name, **msgspec.to_builtins(elite)}
    return out


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        value = _LIST_SEPARATOR.join(str(v) for v in value)
    elif isinstance(value, dict):
        value = _LIST_SEPARATOR.join(f"{k}={'' if v is None else v}" for k, v in value.items())
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value  # model text must never run as a formula (OWASP CSV injection)
    return value


async def export(
    store: EventStore,
    campaign: str | None,
    fmt: Literal["jsonl", "csv"],
    out: TextIO,
    *,
    source: str | Path | None = None,
) -> int:
    """Write one line (``jsonl``) or row (``csv``) per attempt to ``out``; return the count.

    CSV has a header row naming every :class:`AttemptRecord` field; lists are joined with
    ``" | "``, ``ratings`` is written ``rater=severity | ...``, and ``None`` is an empty cell.
    Fields with commas, quotes or line breaks are quoted, so a multi-line reply stays one
    record: open a file for it with ``newline=""``.

    CSV files are opened in spreadsheets, and the text in them comes from models: a text cell
    that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading
    ``'``, so a spreadsheet shows it as text instead of evaluating it as a formula (OWASP's
    CSV-injection advice). Remove that one ``'`` to get the exact text; numbers are written as
    they are, and JSON lines keep every text exactly.

    Raises:
        InputError: No such campaign, or an unknown format.
    """
    if fmt not in ("jsonl", "csv"):
        raise InputError(source, "format", f"unknown export format {fmt!r} (use jsonl or csv)")
    names = await _campaigns(store, campaign, source)
    writer = csv.writer(out)
    if fmt == "csv":
        writer.writerow(AttemptRecord.__struct_fields__)
    encoder = msgspec.json.Encoder()
    count = 0
    for name in names:
        async for rec in stream_records(store, name):  # each written as it comes
            if fmt == "jsonl":
                out.write(encoder.encode(rec).decode() + "\n")
            else:
                writer.writerow(_csv_value(v) for v in msgspec.structs.astuple(rec))
            count += 1
    return count
