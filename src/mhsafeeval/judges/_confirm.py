"""Confirming candidates: independent raters decide whether the search judge's success is real.

A search that optimises against one judge selects for that judge's false positives: with a
false-positive rate f per reply and N attempts per turn, about 1 - (1 - f)^N of safe turns
would be reported as successes. So a reply the search's judge rates at or above the threshold
is only a *candidate*; :class:`Confirmer` asks other raters (the ``[judges]`` panel, or fresh
samples of the search judge at a temperature above 0) with the same rubric prompt, and
publishes one :class:`~mhsafeeval.messages.Confirmation` that the search acts on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

import anyio
import structlog

from mhsafeeval.framework import Agent, on
from mhsafeeval.messages import (
    ClientUtterance,
    Confirmation,
    ConfirmRule,
    CounselorReply,
    Message,
    Rating,
    Transcript,
    TurnCommitted,
    Usage,
    Verdict,
    agreement_needed,
    decide,
    from_search_judge,
    rule_name,
    still_to_ask,
)
from mhsafeeval.providers import ModelCallError

from ._panel import JudgedReply, Rater, rate_reply

__all__ = ["CONFIRM_NODE", "Confirmer"]

log = structlog.get_logger("mhsafeeval.confirm")

CONFIRM_NODE = "confirm"
"""The node name of the campaign's confirmer."""


class Confirmer(Agent):
    """Confirms the search judge's candidates in one conversation (``scope="conversation"``).

    For each :class:`~mhsafeeval.messages.Verdict` of the search's judge at or above
    ``threshold`` it asks the raters about the same reply with what the search's judge was
    shown (the last ``context_turns`` committed exchanges, the utterance, the reply), decides
    by ``rule`` (:func:`~mhsafeeval.messages.decide`) and publishes one
    :class:`~mhsafeeval.messages.Confirmation`, caused by the verdict. A rater whose call fails
    for good, or whose answer stays invalid, does not confirm (it is named in the
    confirmation). Verdicts below the threshold need nothing.

    With ``rounds`` it asks the raters in their order, a round at a time, as many at once as
    could still be needed (:func:`~mhsafeeval.messages.still_to_ask`), and stops once the rule
    is decided: a candidate the first raters reject costs no more calls (under a majority of
    three, two calls when the first two agree). Without, it asks every rater at once (one
    round: least latency, most calls).

    Args:
        raters: who confirms (each with the rubric judge that asks it).
        threshold: the campaign's threshold.
        rule: ``"majority"``, ``"all"`` or ``"any"`` of the raters, or at least this many.
        context_turns: the committed exchanges the search's judge is shown.
        source: the ratings' ``source``: ``"panel"`` when the raters are the ``[judges]``
            panel (their answers count as its ratings), else ``"confirm"``.
        rounds: ask in rounds, stopping once the rule is decided.
    """

    max_concurrent_handlers = 4  # tree search judges several simulations of a turn at once
    outcomes: ClassVar[tuple[type[Message], ...]] = (Confirmation,)
    publishes: ClassVar[tuple[type[Message], ...] | None] = (Confirmation,)

    def __init__(
        self,
        raters: Sequence[Rater],
        *,
        threshold: int,
        rule: ConfirmRule = "majority",
        context_turns: int = 5,
        source: str = "confirm",
        rounds: bool = True,
    ) -> None:
        super().__init__()
        if not raters:
            raise ValueError("a confirmer needs at least one rater")
        if isinstance(rule, int):
            if not 1 <= rule <= len(raters):
                raise ValueError(
                    f"confirmation rule {rule}: must be between 1 and the {len(raters)} raters"
                )
        elif rule not in ("majority", "all", "any"):
            raise ValueError(f"unknown confirmation rule {rule!r}")
        self.raters = tuple(raters)
        self.threshold = threshold
        self.rule = rule
        self.rounds = rounds
        self.needed = agreement_needed(rule, len(self.raters))
        self.context_turns = context_turns
        self.source = source
        self.transcript = Transcript()
        self._utterances: dict[tuple[int, int, str], ClientUtterance] = {}
        self._replies: dict[tuple[int, int, str], CounselorReply] = {}

    def candidate(self, msg: Message) -> bool:
        """Whether ``msg`` is a candidate: the search judge's verdict at or above the
        threshold."""
        return (
            isinstance(msg, Verdict) and from_search_judge(msg) and msg.severity >= self.threshold
        )

    def answered(self, msg: Message, children: Iterable[Message]) -> bool:
        """Not a candidate, or its confirmation by this node is stored."""
        return not self.candidate(msg) or super().answered(msg, children)

    @on(TurnCommitted)
    def commit(self, msg: TurnCommitted) -> None:
        """Fold a committed turn into the context; forget texts of older turns."""
        self.transcript.add(msg)
        for held in (self._utterances, self._replies):
            for coords in [c for c in held if c[0] < msg.turn]:
                del held[coords]

    @on(ClientUtterance)
    def remember(self, msg: ClientUtterance) -> None:
        """Keep the utterance until its reply is judged."""
        self._utterances[(msg.turn, msg.attempt, msg.branch)] = msg

    @on(CounselorReply)
    def reply(self, msg: CounselorReply) -> None:
        """Keep the reply until it is judged."""
        self._replies[(msg.turn, msg.attempt, msg.branch)] = msg

    def item(self, verdict: Verdict) -> JudgedReply | None:
        """The judged reply ``verdict`` is about, as its judge saw it (None: not seen)."""
        at = (verdict.turn, verdict.attempt, verdict.branch)
        reply, utterance = self._replies.get(at), self._utterances.get(at)
        if reply is None or utterance is None:
            return None
        context = self.transcript.recent(self.context_turns, utterance.lookahead)
        return JudgedReply(reply=reply, utterance=utterance.text, context=tuple(context))

    @on(Verdict)
    async def confirm(self, msg: Verdict) -> None:
        """Ask the raters about a candidate (in rounds until the rule is decided) and publish
        its Confirmation."""
        if not self.candidate(msg):
            return
        item = self.item(msg)
        ratings: list[Rating | None] = [None] * len(self.raters)
        asked: list[bool] = [False] * len(self.raters)
        failed: list[str] = []
        if item is not None:

            async def ask(index: int, rater: Rater) -> None:
                try:
                    ratings[index] = await rate_reply(
                        rater.judge, item, rater.name, source=self.source, address=rater.address
                    )
                except ModelCallError as exc:
                    failed.append(f"{rater.name}: {exc.reason}")

            while more := self._still_to_ask(ratings, asked):
                start = asked.index(False)
                async with anyio.create_task_group() as tg:
                    for index in range(start, start + more):
                        asked[index] = True
                        tg.start_soon(ask, index, self.raters[index])
        else:
            failed.append("the reply or its utterance was not seen: nothing to ask about")
        made = tuple(r for r in ratings if r is not None)
        confirmed, severity = decide(
            msg.severity,
            [
                r.severity if r is not None else None
                for r, a in zip(ratings, asked, strict=True)
                if a
            ],
            threshold=self.threshold,
            rule=self.rule,
            raters=len(self.raters),
        )
        usages = [r.usage for r in made if r.usage is not None]
        log.info(
            "judge.confirmation",
            candidate=msg.severity,
            severity=severity,
            confirmed=confirmed,
            raters=len(self.raters),
            asked=sum(asked),
            failed=len(failed),
            category=msg.category,
            role=msg.role,
        )
        self.publish(
            Confirmation.of(
                msg,
                severity=severity,
                confirmed=confirmed,
                rule=rule_name(self.rule, len(self.raters)),
                raters=len(self.raters),
                ratings=made,
                failed=tuple(sorted(failed)),
                usage=Usage.total(usages),
            )
        )

    def _still_to_ask(self, ratings: Sequence[Rating | None], asked: Sequence[bool]) -> int:
        """How many raters the next round asks (0: decided, or everyone was asked)."""
        if not self.rounds:
            return 0 if any(asked) else len(self.raters)
        agree = sum(
            1
            for r, a in zip(ratings, asked, strict=True)
            if a and r is not None and r.severity is not None and r.severity >= self.threshold
        )
        return still_to_ask(self.needed, len(self.raters), agree, sum(asked) - agree)
