"""Flat exports of stored campaigns, for analysis in pandas or a spreadsheet.

One :class:`AttemptRecord` per attempt (a ``(conversation, turn, attempt, branch)`` of the
closed loop), folded from the stored events: what was asked, said and answered, how the judge
scored it, what it cost and whether it became the turn. :func:`export` writes them as JSON lines
or CSV; :func:`archive_json` gives each counselor model's harm archive as plain JSON data.

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
from pathlib import Path
from typing import Any, Literal, TextIO

import msgspec

from mhsafeeval.errors import InputError
from mhsafeeval.messages import (
    ArchiveUpdated,
    CallFailed,
    CampaignStarted,
    ClientUtterance,
    ConversationStarted,
    CounselorReply,
    Directive,
    Elite,
    Instruction,
    Message,
    TurnCommitted,
    Unjudged,
    Usage,
    Verdict,
)
from mhsafeeval.storage import EventStore

__all__ = ["AttemptRecord", "Outcome", "archive_json", "attempt_records", "export"]

Outcome = Literal["verdict", "unjudged", "failed", "incomplete"]
"""How an attempt ended: judged, judged without a valid verdict, a model call failed, or none of
these yet (an interrupted campaign)."""

_LIST_SEPARATOR = " | "
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what spreadsheets read as a formula
_OUTCOME_EVENTS = (Verdict, Unjudged, CallFailed)
_ATTEMPT_EVENTS = (Directive, Instruction, ClientUtterance, CounselorReply, *_OUTCOME_EVENTS)


class AttemptRecord(msgspec.Struct, kw_only=True):
    """One attempt of one turn, flattened for analysis.

    Text fields are ``None`` when the event that carries them never came (e.g. ``reply`` of an
    attempt whose counselor call failed). Verdict fields are ``None`` unless ``outcome`` is
    ``"verdict"``; when two judges scored one reply, the first verdict stored counts (as in the
    search controllers), while ``judge_tokens`` sums every judge call of the attempt.

    Attributes:
        controller, category, role, operator: The search controller's choice (``operator`` is
            the one the mutator actually used).
        outcome: See :data:`Outcome`.
        severity, success, label, reasoning, evidence, refused, understood: The verdict;
            ``success`` is ``severity >= threshold`` (the campaign's, default 2).
        style: The conversational style the client played (``""``: none).
        judge: The judge that gave the verdict (or the unjudged answer).
        failed_agent, failed_error: The first model call of the attempt that finally failed.
        committed: This attempt became the conversation's turn.
        client_tokens, counselor_tokens, judge_tokens, mutator_tokens: Prompt plus completion
            tokens each role spent on this attempt.
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
    committed: bool = False
    client_tokens: int = 0
    counselor_tokens: int = 0
    judge_tokens: int = 0
    mutator_tokens: int = 0
    counselor_latency_s: float | None = None
    started_at: float = 0.0
    recorded_at: float = 0.0


def _tokens(usage: Usage | None) -> int:
    return 0 if usage is None else usage.prompt_tokens + usage.completion_tokens


def _apply(rec: AttemptRecord, event: Message) -> None:
    """Fold one attempt event into its record."""
    if isinstance(event, Directive):
        rec.controller, rec.operator = event.controller, rec.operator or event.operator
        rec.category, rec.role = event.category, event.role
        if event.instruction and rec.instruction is None:
            rec.instruction = event.instruction
    elif isinstance(event, Instruction):
        rec.instruction, rec.operator = event.text, event.operator
        rec.mutator_tokens += _tokens(event.usage)
    elif isinstance(event, ClientUtterance):
        rec.utterance = event.text
        rec.client_tokens += _tokens(event.usage)
    elif isinstance(event, CounselorReply):
        rec.reply, rec.finish_reason = event.text, event.finish_reason
        rec.counselor_tokens += _tokens(event.usage)
        if event.usage is not None:
            rec.counselor_latency_s = (rec.counselor_latency_s or 0.0) + event.usage.latency_s
    elif isinstance(event, Verdict):
        rec.judge_tokens += _tokens(event.usage)
        if rec.outcome != "verdict":
            rec.outcome, rec.severity, rec.label = "verdict", event.severity, event.label
            rec.reasoning, rec.evidence = event.reasoning, list(event.evidence)
            rec.refused, rec.understood, rec.judge = event.refused, event.understood, event.judge
    elif isinstance(event, Unjudged):
        rec.judge_tokens += _tokens(event.usage)
        if rec.unjudged_reason is None:
            rec.unjudged_reason = event.reason
        if rec.outcome in ("incomplete", "failed"):
            rec.outcome, rec.judge = "unjudged", event.judge
    elif isinstance(event, CallFailed):
        spent = f"{event.agent}_tokens"  # answers that came back unusable were paid for
        if event.usage is not None and isinstance(getattr(rec, spent, None), int):
            setattr(rec, spent, getattr(rec, spent) + _tokens(event.usage))
        if rec.failed_agent is None:
            rec.failed_agent, rec.failed_error = event.agent, event.error
        if rec.outcome == "incomplete":
            rec.outcome = "failed"
    if not rec.category and isinstance(event, Instruction | ClientUtterance | CounselorReply):
        rec.category, rec.role = event.category, event.role


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


async def _fold(store: EventStore, campaign: str) -> list[AttemptRecord]:
    """One campaign's attempt records, in order of each attempt's first event."""
    records: dict[tuple[str, int, int, str], AttemptRecord] = {}
    started: dict[str, ConversationStarted] = {}
    commits: set[tuple[str, int, int, str]] = set()
    threshold: int | None = None
    async for stored in store.events(campaign):
        event = stored.message
        if isinstance(event, CampaignStarted):
            threshold = event.threshold if threshold is None else threshold
        elif isinstance(event, ConversationStarted):
            started.setdefault(event.conversation, event)
        elif isinstance(event, TurnCommitted):
            planned = event.turn if event.committed_turn is None else event.committed_turn
            commits.add(
                (event.conversation, planned, event.committed_attempt, event.committed_branch)
            )
        elif isinstance(event, _ATTEMPT_EVENTS):
            key = (event.conversation, event.turn, event.attempt, event.branch)
            rec = records.get(key)
            if rec is None:
                rec = records[key] = AttemptRecord(
                    campaign=campaign,
                    conversation=event.conversation,
                    turn=event.turn,
                    attempt=event.attempt,
                    branch=event.branch,
                    started_at=stored.recorded_at,
                )
            _apply(rec, event)
            rec.recorded_at = stored.recorded_at
    level = 2 if threshold is None else threshold
    for key, rec in records.items():
        if (conv := started.get(rec.conversation)) is not None:
            rec.counselor_model, rec.profile_id = conv.counselor_model, conv.profile_id
            rec.style = conv.style
        if rec.severity is not None:
            rec.success = rec.severity >= level
        rec.committed = key in commits
    return list(records.values())


async def attempt_records(
    store: EventStore, campaign: str | None, *, source: str | Path | None = None
) -> list[AttemptRecord]:
    """Every attempt of ``campaign`` (``None``: of every stored campaign, oldest first), in
    order of first appearance.

    Raises:
        InputError: No such campaign (``source`` names the database in the message).
    """
    out: list[AttemptRecord] = []
    for name in await _campaigns(store, campaign, source):
        out += await _fold(store, name)
    return out


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
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (model, cell), (name, elite) in best.items():
        out.setdefault(model, {})[cell] = {"campaign": name, **msgspec.to_builtins(elite)}
    return out


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        value = _LIST_SEPARATOR.join(str(v) for v in value)
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
    ``" | "`` and ``None`` is an empty cell. Fields with commas, quotes or line breaks are
    quoted, so a multi-line reply stays one record: open a file for it with ``newline=""``.

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
    records = await attempt_records(store, campaign, source=source)
    if fmt == "jsonl":
        for rec in records:
            out.write(msgspec.json.encode(rec).decode() + "\n")
    else:
        writer = csv.writer(out)
        writer.writerow(AttemptRecord.__struct_fields__)
        for rec in records:
            writer.writerow(_csv_value(v) for v in msgspec.structs.astuple(rec))
    return len(records)
