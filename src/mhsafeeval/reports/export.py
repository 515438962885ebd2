"""Flat exports of stored campaigns, for analysis in pandas or a spreadsheet.

One :class:`AttemptRecord` per attempt (a ``(conversation, turn, attempt, branch)`` of the
closed loop), folded from the stored events: what was asked, said and answered, how the judge
scored it, what it cost and whether it became the turn. :func:`export` writes them as JSON lines
or CSV; :func:`archive_json` gives each counselor model's harm archive as plain JSON data.

Records stream, one conversation at a time (:class:`RecordStream`): one read of the store folds
every attempt's compact facts (a :class:`~mhsafeeval.storage.CampaignLog`) and its texts
(:class:`~mhsafeeval.storage.TextFold`) together, and a conversation's records are given as
soon as it completes, then its facts and texts are forgotten. So :func:`export` writes the
records **grouped by conversation**: conversations in order of completion, each one's attempts
in order of their first event, and the conversations that never completed (failed, stopped, in
flight when the campaign ended) last, in order of their first attempt. What is held at once is
the facts and texts of the conversations in flight, and a few names per conversation, never the
campaign's attempts or transcripts.

A conversation's records are final when it completes unless an event stored after that still
changes them. Reporting judges' ratings (and failed rating calls) are such events in every
rated campaign: a ``[judges]`` panel rates a conversation's last turn after it ended, and
``rejudge`` rates a finished campaign. So a rated campaign's stream first reads those events
ahead, through the store's type index, and holds the late ones (without their texts) until the
read reaches their conversation's finish: they are folded in just before it, and the records
given carry them. Any other late event (none in a store the engine wrote: a hand-made store)
makes the stream :attr:`~RecordStream.stale`, and :func:`export` writes that campaign from the
whole fold, as :func:`stream_records` gives it (records in order of each attempt's first event,
every attempt's compact facts held): a file is sought back and written again; a pipe, which
cannot be, is checked first by a cheap read of the store, so it never gets partial output.

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
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO

import msgspec

from mhsafeeval._terminal import visible
from mhsafeeval.errors import InputError
from mhsafeeval.messages import (
    ANSWERED_BY,
    ArchiveUpdated,
    CallFailed,
    CampaignStarted,
    ConversationFinished,
    ConversationStarted,
    Directive,
    Elite,
    Message,
    Rating,
    TurnCommitted,
    Usage,
)
from mhsafeeval.storage import (
    TEXT_EVENTS,
    AttemptFacts,
    AttemptTexts,
    CampaignLog,
    EventStore,
    MemoryEventStore,
    Outcome,
    TextFold,
    closing,
)

__all__ = [
    "AttemptRecord",
    "Outcome",
    "RecordStream",
    "archive_json",
    "archive_of",
    "attempt_records",
    "campaign_log",
    "export",
    "rated",
    "records_of",
    "stream_records",
]

_LIST_SEPARATOR = " | "
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what spreadsheets read as a formula
# What a terminal or a spreadsheet acts on in a cell: C0 controls but the tab and line breaks
# (CSV quotes those), DEL, C1 controls, bidirectional embeddings, overrides and isolates.
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


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
            panel_tokens, confirm_tokens: Prompt plus completion tokens each role spent on
            this attempt (answers of calls that then failed included; ``panel``: reporting
            judges; ``confirm``: confirming its candidate).
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
    confirm_tokens: int = 0
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
        confirm_tokens=tokens.get("confirm", 0),
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


Numbered = tuple[int, AttemptRecord]
"""A record and its attempt's place among the campaign's, in order of first event
(:attr:`~mhsafeeval.storage._log.AttemptFacts.serial`)."""

_PANEL = ANSWERED_BY[Rating]  # the agent of a reporting judge's failed call


def _tag(kind: type[Message]) -> str:
    return str(kind.__struct_config__.tag)


def _brief_decoder(kind: type[Message], *names: str) -> msgspec.json.Decoder[Any]:
    """A JSON decoder of a stored ``kind`` that reads only these fields (their types and
    defaults the message's) and skips the rest of the body undecoded: much cheaper than the
    whole message when the rest is texts."""
    fields = {f.name: f for f in msgspec.structs.fields(kind)}
    spec: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name in names:
        f = fields[name]
        if f.default is not msgspec.NODEFAULT:
            spec.append((name, f.type, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            spec.append((name, f.type, msgspec.field(default_factory=f.default_factory)))
        else:
            spec.append((name, f.type))
    return msgspec.json.Decoder(msgspec.defstruct(f"{kind.__name__}Brief", spec, kw_only=True))


class Fold(Protocol):
    """How a :class:`RecordStream` folds one stored event into its log: as
    :meth:`CampaignLog.add <mhsafeeval.storage.CampaignLog.add>` does, the log first (e.g. a
    :class:`~mhsafeeval.storage.CampaignTally`'s ``fold``)."""

    def __call__(
        self,
        log: CampaignLog,
        event: Message,
        recorded_at: float = ...,
        seq: int = ...,
        *,
        priced: bool | None = ...,
    ) -> None: ...


class _Held(msgspec.Struct, kw_only=True, gc=False):
    """A reporting judge's event stored after its conversation completed, held (no texts,
    names shared) until the read reaches that conversation's finish."""

    seq: int
    recorded_at: float
    priced: bool  # the priced_calls of the latest CampaignStarted stored before it
    turn: int
    attempt: int
    branch: str
    usage: Usage | None
    rater: str | None = None  # None: a failed rating call
    judge: str = ""  # a failed call's model
    category: str = ""
    role: str = ""
    source: str = ""
    severity: int | None = None
    refused: bool = False
    understood: bool = True

    def event(self, campaign: str, conversation: str) -> Message:
        """The event as the log folds it (the texts it never reads left out)."""
        ids: dict[str, Any] = dict(
            campaign=campaign,
            conversation=conversation,
            turn=self.turn,
            attempt=self.attempt,
            branch=self.branch,
        )
        if self.rater is None:
            return CallFailed(**ids, agent=_PANEL, model=self.judge, error="", usage=self.usage)
        return Rating(
            **ids,
            category=self.category,
            role=self.role,
            rater=self.rater,
            judge=self.judge,
            severity=self.severity,
            refused=self.refused,
            understood=self.understood,
            source=self.source,
            usage=self.usage,
        )


def _held(event: Any, seq: int, at: float, priced: bool, name: Callable[[str], str]) -> _Held:
    """What is held of a Rating or a failed rating call (``event``: the message, or what
    :data:`_AHEAD_BRIEFS` decodes of it)."""
    usage = event.usage
    if usage is not None:
        usage = msgspec.structs.replace(usage, model=name(usage.model))
    ids: dict[str, Any] = dict(seq=seq, recorded_at=at, priced=priced, usage=usage)
    ids.update(turn=event.turn, attempt=event.attempt, branch=name(event.branch))
    if not hasattr(event, "rater"):
        return _Held(**ids, judge=name(event.model))
    return _Held(
        **ids,
        rater=name(event.rater),
        judge=name(event.judge),
        category=name(event.category),
        role=name(event.role),
        source=name(event.source),
        severity=event.severity,
        refused=event.refused,
        understood=event.understood,
    )


_AT = ("conversation", "turn", "attempt", "branch", "usage")
_AHEAD_BRIEFS: dict[str, msgspec.json.Decoder[Any]] = {
    _tag(CampaignStarted): _brief_decoder(CampaignStarted, "priced_calls"),
    _tag(ConversationFinished): _brief_decoder(ConversationFinished, "conversation", "status"),
    _tag(CallFailed): _brief_decoder(CallFailed, *_AT, "agent", "model"),
    _tag(Rating): _brief_decoder(
        Rating,
        *_AT,
        *("category", "role", "rater", "judge", "source", "severity", "refused", "understood"),
    ),
}


async def _late_ratings(
    store: EventStore, campaign: str, last_seq: int | None
) -> dict[str, tuple[int, list[_Held]]]:
    """The reporting judges' events stored after their conversation's first finish (if it
    completed), by conversation: that finish's seq and the events, in stored order."""
    names: dict[str, str] = {}

    def name(text: str) -> str:
        return names.setdefault(text, text)

    ends: dict[str, int] = {}  # conversation -> seq of its first finish (0: not completed)
    held: dict[str, tuple[int, list[_Held]]] = {}
    priced = False
    raw = not isinstance(store, MemoryEventStore)  # a memory store holds them decoded
    started, finished, rating = _tag(CampaignStarted), _tag(ConversationFinished), _tag(Rating)
    async with closing(store.events(campaign, types=list(_AHEAD_BRIEFS), raw=raw)) as events:
        async for stored in events:
            if last_seq is not None and stored.seq > last_seq:
                break
            kind = stored.type
            event: Any = stored.message  # the message, or the fields it needs decoded
            if event is None:
                event = _AHEAD_BRIEFS[kind].decode(stored.body)
            if kind == started:
                priced = event.priced_calls
            elif kind == finished:
                completed = event.status == "completed"
                ends.setdefault(name(event.conversation), stored.seq if completed else 0)
            elif kind == rating or event.agent == _PANEL:
                end = ends.get(event.conversation, 0)
                if end:
                    _, late = held.setdefault(name(event.conversation), (end, []))
                    at = stored.recorded_at
                    late.append(_held(event, stored.seq, at, priced, name))
    return held


class RecordStream:
    """One read of a stored campaign that gives each conversation's attempt records as soon as
    the conversation completes (see the module for the order and what is held).

    Iterate it once; each item is one conversation's records, its attempts in order of first
    event. Then :attr:`log` is the campaign's log, which forgot each conversation it gave
    (as a ``CampaignLog(on_close=...)`` does: its archive, cells, threshold, config and running
    totals are all there), and :attr:`stale` says whether a record given can be wrong.

    Args:
        store: The event store.
        campaign: A stored campaign.
        on_close: Also called with each conversation that completed, before the records are
            taken and it is forgotten (e.g. a :class:`~mhsafeeval.storage.CampaignTally`'s
            ``close``).
        fold: Folds each stored event into the log instead of ``log.add`` (see :class:`Fold`):
            a :class:`~mhsafeeval.storage.CampaignTally`'s ``fold``, whose ``close`` is
            ``on_close``, takes the reporting judges' ratings of conversations already given
            (they come late: a panel rates after the turn, ``rejudge`` after the campaign), so
            they are not :attr:`stale`. The records given then lack those ratings, unless
            ``ratings`` read them ahead.
        ratings: First read the reporting judges' events (ratings, failed rating calls)
            stored after their conversation completed (see the module), and fold each into
            the log, with ``fold`` if given, just before the finish that gives its
            conversation (priced as the run that stored it priced its calls), so the records
            given carry them. What is held meanwhile is those events, without their texts,
            until that finish is read. For a campaign :func:`rated` says is rated.
        last_seq: Read no event stored after this ``seq`` (None: read to the end).

    Example:
        >>> import anyio
        >>> from mhsafeeval.messages import ConversationFinished, ConversationStarted, Directive
        >>> from mhsafeeval.storage import MemoryEventStore
        >>> def conversation(i: int) -> list:
        ...     ids = dict(campaign="c", conversation=f"c/m/p/{i}")
        ...     cell = dict(category="blaming", role="enabler", controller="map-elites")
        ...     return [ConversationStarted(**ids, counselor_model="m", profile_id="p"),
        ...             *(Directive(**ids, turn=t, **cell) for t in range(2)),
        ...             ConversationFinished(**ids, turns=2, status="completed")]
        >>> async def main() -> list[list[tuple[str, int]]]:
        ...     async with MemoryEventStore() as store:
        ...         first, second = conversation(0), conversation(1)
        ...         for event in [*first[:3], *second, first[3]]:  # the second ends first
        ...             await store.append(event)
        ...         stream = RecordStream(store, "c")
        ...         return [[(r.conversation, r.turn) for r in group] async for group in stream]
        >>> anyio.run(main)
        [[('c/m/p/1', 0), ('c/m/p/1', 1)], [('c/m/p/0', 0), ('c/m/p/0', 1)]]
    """

    def __init__(
        self,
        store: EventStore,
        campaign: str,
        *,
        on_close: Callable[[CampaignLog, str], None] | None = None,
        fold: Fold | None = None,
        ratings: bool = False,
        last_seq: int | None = None,
    ) -> None:
        self.store, self.campaign = store, campaign
        self._fold = fold
        self._ratings, self._last_seq = ratings, last_seq
        self.log = CampaignLog(on_close=self._close)
        self.late_elites = 0
        """ArchiveUpdated events of a conversation already given (none in a campaign the engine
        stored): who reads the elites' conversations from the records misses them."""
        self.read_ahead = 0
        """Reporting judges' events stored after their conversation completed, read ahead
        (``ratings``): each is held, without its texts, until the read reaches the finish."""
        self._on_close = on_close
        self._texts = TextFold()
        self._ready: list[list[Numbered]] = []
        self._thresholds: set[int] = set()  # what the records given counted success at

    @property
    def stale(self) -> bool:
        """Whether an event read after a conversation was given could change its records (an
        event of that conversation, or a threshold stored after it): then they are not the
        whole fold's, and :func:`stream_records` gives the right ones."""
        return bool(self.log.late) or any(t != self.log.threshold for t in self._thresholds)

    def _close(self, log: CampaignLog, conversation: str) -> None:
        if self._on_close is not None:
            self._on_close(log, conversation)
        self._thresholds.add(log.threshold)
        if attempts := log.attempts_in(conversation):
            self._ready.append(self._records(attempts))

    def _records(self, attempts: list[AttemptFacts]) -> list[Numbered]:
        log, texts = self.log, self._texts
        return [(a.serial, record_of(log, a, texts.pop(a.key), self.campaign)) for a in attempts]

    async def numbered(self) -> AsyncIterator[list[Numbered]]:
        """The same conversations, each record with its attempt's serial (in order of first
        event across the campaign: how a whole fold orders them)."""
        log, texts, last = self.log, self._texts, self._last_seq
        ahead = await _late_ratings(self.store, self.campaign, last) if self._ratings else {}
        self.read_ahead = sum(len(late) for _, late in ahead.values())
        folded: set[int] = set()  # seqs of held events folded ahead of their place
        async with closing(self.store.events(self.campaign)) as events:
            async for stored in events:
                if last is not None and stored.seq > last:
                    break
                if stored.seq in folded:
                    folded.discard(stored.seq)
                    continue
                event = stored.message
                assert event is not None
                texts.add(event)
                if isinstance(event, ArchiveUpdated):
                    facts = log.conversations.get(event.conversation)
                    self.late_elites += facts is not None and facts.status == "completed"
                elif ahead and isinstance(event, ConversationFinished):
                    _, late = ahead.pop(event.conversation, (0, []))
                    facts = log.conversations.get(event.conversation)
                    closes = facts is not None and facts.status is None
                    if closes and event.status == "completed":  # its late ratings go first
                        for h in late:
                            if h.seq > stored.seq:
                                e = h.event(event.campaign, event.conversation)
                                self._add(e, h.recorded_at, h.seq, h.priced)
                                folded.add(h.seq)
                self._add(event, stored.recorded_at, stored.seq, None)
                if self._ready:
                    ready, self._ready = self._ready, []
                    for group in ready:
                        yield group
        rest: dict[str, list[AttemptFacts]] = {}  # in order of each one's first attempt
        for a in log.attempts.values():
            rest.setdefault(a.conversation, []).append(a)
        for attempts in rest.values():
            yield self._records(attempts)

    def _add(self, event: Message, recorded_at: float, seq: int, priced: bool | None) -> None:
        if self._fold is None:
            self.log.add(event, recorded_at, seq, priced=priced)
        else:
            self._fold(self.log, event, recorded_at, seq, priced=priced)

    async def __aiter__(self) -> AsyncIterator[list[AttemptRecord]]:
        async for group in self.numbered():
            yield [record for _, record in group]


async def rated(store: EventStore, campaign: str) -> bool:
    """Whether reporting judges rated, or failed to rate, any reply of the campaign (read from
    the store's type index). Their events may be stored after the conversation completed
    (``rejudge`` adds them to a finished campaign), so such a campaign is streamed with
    ``RecordStream(..., ratings=True)``."""
    kinds = [_tag(Rating), _tag(CallFailed)]
    async with closing(store.events(campaign, types=kinds)) as events:
        async for stored in events:
            event = stored.message
            if isinstance(event, Rating) or (
                isinstance(event, CallFailed) and event.agent == _PANEL
            ):
                return True
        return False


async def stream_records(
    store: EventStore, campaign: str, log: CampaignLog | None = None
) -> AsyncIterator[AttemptRecord]:
    """The attempt records of one stored campaign, one at a time, in order of each attempt's
    first event: the whole fold (every attempt's compact facts are held; the texts are read
    apart, in a second read of the store, and each record given once its texts are all read).
    :class:`RecordStream` holds only the conversations in flight.

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
        async with closing(store.events(campaign, types=TEXT_EVENTS)) as events:
            async for stored in events:
                if stored.seq > log.last_seq:
                    break
                assert stored.message is not None
                fold.add(stored.message)
                while head is not None and head.text_seq <= stored.seq:
                    yield record_of(log, head, fold.pop(head.key), campaign)
                    head = next(pending, None)
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
    if isinstance(value, str):
        value = _UNSAFE.sub(lambda m: visible(m.group()), value)  # ESC -> \x1b, RLO -> \u202e
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value  # model text must never run as a formula (OWASP CSV injection)
    return value


_PIPE_BRIEFS: dict[str, msgspec.json.Decoder[Any]] = {
    _tag(CampaignStarted): _brief_decoder(CampaignStarted, "threshold"),
    _tag(ConversationFinished): _brief_decoder(ConversationFinished, "conversation", "status"),
    _tag(CallFailed): _brief_decoder(CallFailed, "conversation", "agent"),
}
_PIPE_BRIEF = _brief_decoder(Message, "conversation")
_FOLDED_KINDS: list[type[Message]] = [TurnCommitted, Directive, CallFailed, *ANSWERED_BY]
_FOLDED = frozenset(map(_tag, _FOLDED_KINDS))
"""The events the log folds into a conversation's attempts and turns (a late one is stale)."""
_PLANNED = (*_FOLDED, _tag(CampaignStarted), _tag(ConversationStarted), _tag(ConversationFinished))
_OPEN, _CLOSED, _CLOSED_AT_FIRST_END, _ENDED = range(4)


async def _pipe_plan(store: EventStore, campaign: str) -> tuple[bool, bool, int]:
    """Whether a :class:`RecordStream` of the campaign (``ratings`` when it is rated) would
    go :attr:`~RecordStream.stale`, whether it is rated (:func:`rated`), and the last seq
    that decides it (the stream then reads no further).

    One read of the events that decide it, each body decoded only for its conversation (and a
    finish's status, a failed call's agent, a start's threshold), following the log's rules
    for when a conversation is given and what comes late. A reporting judge's event stored
    after the first finish of its conversation, when that finish gave it, is read ahead by the
    stream, so it is not late; any other event the log folds into a given conversation is,
    and so is a first ``CampaignStarted`` whose threshold is not 2 stored after a
    conversation was given."""
    raw = not isinstance(store, MemoryEventStore)  # a memory store holds them decoded
    state: dict[str, int] = {}
    ended_first: set[str] = set()  # finished before they started: the log passed that by
    threshold: int | None = None
    given_early = rated = False
    last = 0
    started, finished = _tag(ConversationStarted), _tag(ConversationFinished)
    failed, rating, campaign_started = _tag(CallFailed), _tag(Rating), _tag(CampaignStarted)
    async with closing(store.events(campaign, types=_PLANNED, raw=raw)) as events:
        async for stored in events:
            last, kind = stored.seq, stored.type
            brief: Any = stored.message  # the message's own fields, or the same names decoded:
            if brief is None:
                brief = _PIPE_BRIEFS.get(kind, _PIPE_BRIEF).decode(stored.body)
            if kind == campaign_started:
                threshold = brief.threshold if threshold is None else threshold
                continue
            conversation = brief.conversation
            now = state.get(conversation)
            if kind == started:
                if now is None:
                    state[conversation] = _OPEN
            elif kind == finished:
                if now == _OPEN and brief.status == "completed":
                    first = conversation not in ended_first
                    state[conversation] = _CLOSED_AT_FIRST_END if first else _CLOSED
                    given_early = given_early or threshold is None
                elif now == _OPEN:
                    state[conversation] = _ENDED
                elif now is None:
                    ended_first.add(conversation)
            else:
                panel = kind == rating or (kind == failed and brief.agent == _PANEL)
                rated = rated or panel
                if now == _CLOSED or (now == _CLOSED_AT_FIRST_END and not panel):
                    return True, rated, last
    return given_early and threshold not in (None, 2), rated, last


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
    they are, and JSON lines keep every text exactly. Control characters (C0 but tab and line
    breaks, DEL, C1) and bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069)
    are written as escapes (``\\x1b``, ``\\u202e``), so that neither a terminal the CSV is
    printed to nor a spreadsheet gets them raw (a backslash already in the text is kept as it
    is, so such a cell is not exact: JSON lines are).

    Records come grouped by conversation, in order of completion (see the module), a rated
    campaign's too (its late ratings read ahead). If an event stored after a conversation
    completed still changed its records (see :attr:`RecordStream.stale`; only a hand-made
    store has one), the campaign is written from the whole fold, in order of each attempt's
    first event: to a file, ``out`` is sought back to where its lines began, cut there, and
    written again; to an output that cannot seek (a pipe), a read of the store that decodes
    only each event's conversation (and a few fields of a few types) first tells whether the
    stream would go stale, and if so the whole fold is written from the start. What is read
    then stops at the last event that read saw, so a pipe gets complete records, once.

    Raises:
        InputError: No such campaign, or an unknown format, or (a pipe) a late event stored
            while the campaign was read, which a run never stores.
    """
    if fmt not in ("jsonl", "csv"):
        raise InputError(source, "format", f"unknown export format {fmt!r} (use jsonl or csv)")
    names = await _campaigns(store, campaign, source)
    writer = csv.writer(out)
    if fmt == "csv":
        writer.writerow(AttemptRecord.__struct_fields__)
    encoder = msgspec.json.Encoder()

    def write(rec: AttemptRecord) -> None:
        if fmt == "jsonl":
            out.write(encoder.encode(rec).decode() + "\n")
        else:
            writer.writerow(_csv_value(v) for v in msgspec.structs.astuple(rec))

    async def whole(name: str) -> int:
        written = 0
        async for rec in stream_records(store, name):
            write(rec)
            written += 1
        return written

    count = 0
    for name in names:
        start = out.tell() if out.seekable() else None
        last: int | None = None  # a pipe's stream reads what its pre-pass read, no more
        if start is not None:
            ratings = await rated(store, name)
        else:  # what is written cannot be taken back: decide first
            stale, ratings, last = await _pipe_plan(store, name)
            if stale:
                count += await whole(name)
                continue
        stream, written = RecordStream(store, name, ratings=ratings, last_seq=last), 0
        async for group in stream:  # each conversation written as it completes
            for rec in group:
                write(rec)
            written += len(group)
        if stream.stale:
            if start is None:  # the store changed between the reads (runs do not do that)
                raise InputError(
                    source,
                    "campaign",
                    f"campaign {name!r} changed while it was read: events of a conversation "
                    "were stored after it completed, so the records written are not all "
                    "final, and this output cannot be rewritten: export to a file (--out)",
                )
            out.seek(start)
            out.truncate()
            written = await whole(name)
        count += written
    return count
