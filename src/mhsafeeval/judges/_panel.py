"""Reporting judges: rate the replies a campaign's search judge judged, apart from the search.

The search optimises against its own judge, so that judge's false positives are selected for;
reporting judges (a campaign's ``[judges]`` panel, ``mhsafeeval rejudge``) rate the same
replies with the same rubric judge (prompt, schema, sampling, re-asks, threshold) and never
see any verdict. :class:`ReplyFold` rebuilds, from a campaign's events, each judged reply with
exactly the context the search's judge was shown; :func:`rate_reply` makes one
:class:`~mhsafeeval.messages.Rating` of it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from mhsafeeval.messages import (
    CallFailed,
    ClientUtterance,
    Confirmation,
    ConversationFinished,
    CounselorReply,
    Exchange,
    Message,
    Rating,
    TurnCommitted,
    Unjudged,
    Usage,
    Verdict,
    from_search_judge,
)
from mhsafeeval.providers import ChatMessage, ModelCallError, StructuredOutputError

from ._judge import RubricJudge, verdict_fields
from ._prompt import build_judge_messages

__all__ = [
    "PANEL_INPUTS",
    "JudgedReply",
    "Rater",
    "ReplyFold",
    "StoredReplies",
    "failed_rater",
    "failed_rating",
    "judged_prompt",
    "panel_ratings",
    "rate_reply",
    "rater_address",
    "rater_names",
    "raters_for",
]

Coords = tuple[str, int, int, str]
"""A reply's place: (conversation, turn, attempt, branch)."""

PANEL_INPUTS: tuple[type[Message], ...] = (
    Confirmation,
    TurnCommitted,
    ClientUtterance,
    CounselorReply,
    Verdict,
    Unjudged,
    Rating,
    ConversationFinished,
)
"""The events :class:`ReplyFold` reads (a verdict only tells it that a reply was judged)."""

_CONVERSATION_INPUTS = (
    ClientUtterance,
    CounselorReply,
    Verdict,
    TurnCommitted,
    ConversationFinished,
)
"""What :class:`ReplyFold` keeps per conversation (until it ends, with ``forget``)."""

_SAMPLE = re.compile(r"#(\d+)$")


def rater_names(address: str, samples: int) -> list[str]:
    """The raters one judge model stands for: its address, then ``address#2`` ... ``#samples``.

    Example:
        >>> rater_names("litellm/openai/gpt-4o", 3)
        ['litellm/openai/gpt-4o', 'litellm/openai/gpt-4o#2', 'litellm/openai/gpt-4o#3']
    """
    return [address] + [f"{address}#{k}" for k in range(2, samples + 1)]


def rater_address(rater: str) -> str:
    """The judge address a rater name stands for (``rater_names`` read backwards)."""
    return _SAMPLE.sub("", rater)


class JudgedReply(msgspec.Struct, frozen=True, kw_only=True):
    """A counselor reply the search's judge judged, with what that judge was shown."""

    reply: CounselorReply
    utterance: str
    """The client's utterance the reply answered."""
    context: tuple[Exchange, ...]
    """The exchanges shown before it: committed turns before the reply's turn, then the
    attempt's lookahead (stored by earlier versions' tree search), the last
    ``context_turns`` of them."""

    @property
    def coords(self) -> Coords:
        """Where the reply sits: (conversation, turn, attempt, branch)."""
        r = self.reply
        return (r.conversation, r.turn, r.attempt, r.branch)


class _Conversation:
    def __init__(self) -> None:
        self.turns: dict[int, Exchange] = {}
        self.utterances: dict[tuple[int, int, str], ClientUtterance] = {}
        self.replies: dict[tuple[int, int, str], CounselorReply] = {}
        self.judged: set[tuple[int, int, str]] = set()
        self.given: set[tuple[int, int, str]] = set()


class ReplyFold:
    """Folds a campaign's events (in stored or published order) into its judged replies.

    A reply counts as judged when a :class:`~mhsafeeval.messages.Verdict` is stored for it;
    the verdict's content is never kept. :meth:`add` returns the judged replies that became
    ready to rate with that event: a reply as soon as it is judged, when every turn before its
    own is committed (what a rater is shown is then known, so a turn still open when a run
    stops at its budget is rated too), a candidate the campaign confirms once its
    :class:`~mhsafeeval.messages.Confirmation` is here (the panel's ratings given there are
    its ratings: not asked twice); any other (a confirmation that failed, the lookahead
    replies of earlier versions' tree search) once its turn is committed, and all of a
    conversation's once it has ended. :meth:`judged` lists every judged reply.

    Args:
        context_turns: the committed exchanges a judge sees (``campaign.judge_context_turns``,
            else ``campaign.context_turns``; negative: all).
        forget: drop a conversation's texts once it has ended and its replies were given
            (a campaign's panel, which never asks :meth:`judged`): what stays per reply is
            whether it was rated or unjudged.
        confirmed_at: the threshold of a campaign that confirms candidates: a reply judged at
            or above it waits for its confirmation (None: nothing is confirmed).
    """

    def __init__(
        self, context_turns: int, *, forget: bool = False, confirmed_at: int | None = None
    ) -> None:
        self.context_turns = context_turns
        self.forget = forget
        self.confirmed_at = confirmed_at
        self._convs: dict[str, _Conversation] = {}
        self._rated: set[tuple[Coords, str]] = set()
        self.unjudged: set[Coords] = set()
        """Replies the search's judge left unjudged (nothing to rate)."""

    def _conv(self, conversation: str) -> _Conversation:
        conv = self._convs.get(conversation)
        if conv is None:
            conv = self._convs[conversation] = _Conversation()
        return conv

    def add(self, msg: Message) -> list[JudgedReply]:
        """Fold one event in; returns the judged replies it made ready (each once)."""
        at = (msg.turn, msg.attempt, msg.branch)
        if isinstance(msg, Verdict | Unjudged) and not from_search_judge(msg):
            return []  # another judge in the graph: the panel rates what the search judged
        if isinstance(msg, Unjudged):
            self.unjudged.add((msg.conversation, *at))
            return []
        if isinstance(msg, Rating):  # no conversation state: ratings come after its end
            self._rated.add(((msg.conversation, *at), msg.rater))
            return []
        if isinstance(msg, Confirmation):  # the panel's raters confirmed it: rated already
            for rating in panel_ratings(msg):
                self._rated.add(((msg.conversation, *at), rating.rater))
            conv = self._convs.get(msg.conversation)
            if conv is None or not self._shown(conv, msg.turn):
                return []
            return self._take(msg.conversation, conv, msg.turn, only=at)
        if not isinstance(msg, _CONVERSATION_INPUTS):
            return []
        conv = self._conv(msg.conversation)
        if isinstance(msg, ClientUtterance):
            conv.utterances[at] = msg
        elif isinstance(msg, CounselorReply):
            conv.replies[at] = msg
        elif isinstance(msg, Verdict):
            conv.judged.add(at)
            waits = self.confirmed_at is not None and msg.severity >= self.confirmed_at
            if not waits and self._shown(conv, msg.turn):
                return self._take(msg.conversation, conv, msg.turn, only=at)
        elif isinstance(msg, TurnCommitted):
            conv.turns[msg.turn] = Exchange(msg.client_text, msg.counselor_text)
            return self._take(msg.conversation, conv, msg.turn)
        elif isinstance(msg, ConversationFinished):
            ready = self._take(msg.conversation, conv, None)
            if self.forget:
                del self._convs[msg.conversation]
            return ready
        return []

    def unrated(self, raters: Sequence[str]) -> StoredReplies:
        """A fold of stored events through this one that holds the judged replies not yet
        rated by every one of ``raters`` (see :class:`StoredReplies`)."""
        return StoredReplies(self, raters)

    def rated(self, item: JudgedReply, rater: str) -> bool:
        """Whether a stored rating of ``item`` by ``rater`` was folded in."""
        return (item.coords, rater) in self._rated

    def judged(self) -> list[JudgedReply]:
        """Every judged reply folded in so far (ready or not), in conversation order."""
        out: list[JudgedReply] = []
        for conversation, conv in self._convs.items():
            out += [
                item
                for at in sorted(conv.judged)
                if (item := self._item(conversation, conv, at)) is not None
            ]
        return out

    @staticmethod
    def _shown(conv: _Conversation, turn: int) -> bool:
        """Whether what a reply of ``turn`` is shown is known: every turn before it committed."""
        return all(t in conv.turns for t in range(turn))

    def _take(
        self,
        conversation: str,
        conv: _Conversation,
        turn: int | None,
        only: tuple[int, int, str] | None = None,
    ) -> list[JudgedReply]:
        ready = sorted(
            at
            for at in ({only} if only is not None else conv.judged) - conv.given
            if at in conv.replies and (turn is None or at[0] <= turn)
        )
        conv.given.update(ready)
        return [item for at in ready if (item := self._item(conversation, conv, at)) is not None]

    def _item(
        self, conversation: str, conv: _Conversation, at: tuple[int, int, str]
    ) -> JudgedReply | None:
        reply, utterance = conv.replies.get(at), conv.utterances.get(at)
        if reply is None or utterance is None:
            return None  # the judge cannot have judged it (it would have been unjudged)
        shown = [conv.turns[t] for t in sorted(conv.turns) if t < reply.turn]
        shown += utterance.lookahead
        n = self.context_turns
        context = shown if n < 0 else shown[-n:] if n else []
        return JudgedReply(reply=reply, utterance=utterance.text, context=tuple(context))


class StoredReplies:
    """The judged replies of a stored campaign not yet rated by every rater, folded as its
    events stream past in stored order (a resumed run's panel).

    A reply is given by ``fold`` when it is judged (or confirmed, or its turn is committed),
    but its ratings are stored later (the panel rates it then), so whether it is rated is
    known only once its ratings have passed: a reply is held until every one of ``raters`` has
    rated it, then dropped. What is still held at the end (:meth:`take`) is what is left to
    rate.

    Example:
        >>> replies = StoredReplies(ReplyFold(0), ["judge-a"])
        >>> replies.take()
        []
    """

    def __init__(self, fold: ReplyFold, raters: Sequence[str]) -> None:
        self.fold = fold
        self.raters = tuple(raters)
        self._held: dict[Coords, JudgedReply] = {}

    def add(self, msg: Message) -> None:
        """Fold in one stored event."""
        for item in self.fold.add(msg):
            if not self._rated(item):
                self._held[item.coords] = item
        if isinstance(msg, Rating):
            at: Coords = (msg.conversation, msg.turn, msg.attempt, msg.branch)
            held = self._held.get(at)
            if held is not None and self._rated(held):
                del self._held[at]

    def _rated(self, item: JudgedReply) -> bool:
        return all(self.fold.rated(item, rater) for rater in self.raters)

    @property
    def held(self) -> int:
        """Replies held so far (not rated by every rater yet)."""
        return len(self._held)

    def take(self) -> list[JudgedReply]:
        """The replies left to rate, in stored order; forgets them."""
        items, self._held = list(self._held.values()), {}
        return items


class Rater(msgspec.Struct, frozen=True, kw_only=True):
    """One rater: its name (``address`` or ``address#k``), its judge address, and the rubric
    judge (on that model) that asks."""

    name: str
    address: str
    judge: RubricJudge


def raters_for(address: str, samples: int, judge: RubricJudge) -> list[Rater]:
    """The ``samples`` raters of one judge model (they share its judge, and so its limit)."""
    return [Rater(name=n, address=address, judge=judge) for n in rater_names(address, samples)]


def panel_ratings(msg: Confirmation) -> list[Rating]:
    """The panel's ratings a confirmation holds (its raters were the ``[judges]`` panel), as
    the panel stores them: without usage, which the confirmation counts."""
    return [msgspec.structs.replace(r, usage=None) for r in msg.ratings if r.source == "panel"]


def judged_prompt(judge: RubricJudge, item: JudgedReply) -> list[ChatMessage]:
    """The prompt ``judge`` is shown for ``item``: what the search's judge was shown for it."""
    reply = item.reply
    return build_judge_messages(
        judge.taxonomy,
        reply.category,
        reply.role,
        context=list(item.context),
        utterance=item.utterance,
        reply=reply.text,
        message_id=reply.id,
        threshold=judge.threshold,
    )


async def rate_reply(
    judge: RubricJudge, item: JudgedReply, rater: str, *, source: str, address: str = ""
) -> Rating:
    """One rating of ``item`` by ``rater`` (judge ``address``, default the rater's), asked the
    way the rubric judge asks: its schema, sampling, bounded re-asks and checks. An answer
    still invalid after the re-asks is a Rating with ``severity=None`` and the reason.

    Raises:
        ModelCallError: the call failed for good (see :func:`failed_rating`).
    """
    reply = item.reply
    ids = {
        **reply.child_ids(key=Rating.key_for(rater)),
        "category": reply.category,
        "role": reply.role,
        "rater": rater,
        "judge": address or rater_address(rater),
        "source": source,
    }
    try:
        answer = await judge.ask(judged_prompt(judge, item), reply.text, item.utterance)
    except StructuredOutputError as exc:
        usage = Usage.of(*exc.completions) if exc.completions else None
        return Rating(**ids, reason=exc.reason, asks=len(exc.completions), usage=usage)
    verdict, _ = judge.check(answer.value, reply.text, item.utterance)
    return Rating(**ids, **verdict_fields(verdict, answer))


def failed_rating(item: JudgedReply, rater: str, error: ModelCallError, run: str) -> CallFailed:
    """The record of a rating whose call failed for good: ``CallFailed(agent="panel")`` at the
    reply's coordinates, keyed ``rating:<rater>@<run>`` (one per rater, reply and run). It is
    not a rating: the next run asks again."""
    failed = CallFailed.caused_by(item.reply, "panel", error)
    return msgspec.structs.replace(failed, key=f"{Rating.key_for(rater)}@{run}")


def failed_rater(msg: CallFailed) -> str:
    """The rater of a :func:`failed_rating` record (``""`` for any other CallFailed)."""
    prefix = Rating.key_for("")
    if msg.agent != "panel" or not msg.key.startswith(prefix):
        return ""
    return msg.key[len(prefix) :].rpartition("@")[0]
