"""Search controllers: plugins that read judge events and steer the next attempt.

A controller is an :class:`~mhsafeeval.framework.Agent` that receives every conversation's events
(register it with ``scope="global"``). :class:`TurnController` runs the paper's refinement loop
for each conversation; subclasses only choose each turn's first directive (:meth:`plan_turn`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from random import Random
from typing import ClassVar

import msgspec
import structlog

from mhsafeeval.framework import on
from mhsafeeval.messages import (
    ArchiveUpdated,
    CallFailed,
    Confirmation,
    ConversationFinished,
    ConversationStarted,
    Directive,
    Message,
    RefinerNotes,
    Seed,
    TurnCommitted,
    Unjudged,
    Verdict,
)

from ._base import ArchiveController, AttemptTexts
from ._types import NoOptions, SearchRun, TargetingOptions
from .archive import CellId, HarmArchive, Plan
from .rng import derive_rng

__all__ = [
    "MapElitesController",
    "RandomController",
    "SingleTurnController",
    "TurnController",
]

log = structlog.get_logger("mhsafeeval.search")


class _Attempt(AttemptTexts):
    __slots__ = ("category", "error", "failed", "role")

    def __init__(self, category: str, role: str) -> None:
        super().__init__()
        self.category = category
        self.role = role
        self.failed = False
        self.error = ""


class _Conversation:
    __slots__ = ("attempt", "attempts", "campaign", "max_turns", "model", "turn", "waiting")

    def __init__(self, campaign: str, model: str, max_turns: int) -> None:
        self.campaign = campaign
        self.model = model
        self.max_turns = max_turns
        self.turn = 0
        self.attempt = 0
        self.attempts: dict[int, _Attempt] = {}
        self.waiting = False  # for the refiner's notes on the current attempt


class TurnController(ArchiveController):
    """The refinement loop shared by controllers.

    Per conversation and turn: publish a :class:`Directive` for attempt 0 (from
    :meth:`plan_turn`); when its :class:`Verdict` reaches the threshold, commit the turn; below
    it, wait for the refiner's :class:`RefinerNotes` and direct attempt + 1 at the same cell (a
    ``vary`` of the last instruction, with the cell's recent notes), up to ``max_attempts``.
    Unjudged replies, failed counselor calls and answers that stayed unusable use up the attempt
    without counting as safe; a call of any other role that never got an answer
    (:attr:`CallFailed.owed`) ends the conversation as failed without committing the turn, so
    the next run asks again and continues from there. Every judged
    reply is offered to the counselor model's :class:`HarmArchive` (one per model), and each
    improvement is published as :class:`ArchiveUpdated`.

    The committed attempt is the first success, else the most severe judged attempt (the latest
    on ties), else the latest one the counselor answered; a turn with no answer at all ends the
    conversation as failed.
    """

    name = "turn-loop"
    publishes = (Directive, TurnCommitted, ArchiveUpdated, ConversationFinished)
    notes_kept: ClassVar[int] = 5
    """The recent refiner notes per counselor model and cell that a directive carries."""
    single_turn: ClassVar[bool] = False
    """Run every conversation as one turn, whatever ``run.single_turn`` says."""

    def __init__(
        self,
        cells: Iterable[CellId],
        run: SearchRun | None = None,
        options: NoOptions | TargetingOptions | None = None,
    ) -> None:
        self.run = run or SearchRun()
        if self.single_turn:
            self.run = msgspec.structs.replace(self.run, single_turn=True)
        targeting = options if isinstance(options, TargetingOptions) else None
        super().__init__(cells, self.run.threshold, targeting)
        self.notes: dict[tuple[str, CellId], deque[str]] = {}
        self._convs: dict[str, _Conversation] = {}
        self._planning = ""  # the counselor model of the turn being planned

    # -- what subclasses decide ----------------------------------------------------------------

    def plan_turn(self, archive: HarmArchive, rng: Random) -> Plan:
        """The first attempt of a turn: target cell, operator and seeds."""
        raise NotImplementedError

    # -- helpers -------------------------------------------------------------------------------

    def texts(self, msg: Message) -> _Attempt | None:
        cur = self._current(msg)
        return cur[1] if cur is not None else None

    def _current(self, msg: Message) -> tuple[_Conversation, _Attempt] | None:
        conv = self._convs.get(msg.conversation)
        if conv is None or (msg.turn, msg.attempt) != (conv.turn, conv.attempt):
            return None  # not ours, or a stale event of an earlier attempt
        return conv, conv.attempts[conv.attempt]

    def _direct(self, source: Message, conv: _Conversation) -> None:
        s = self.run
        rng = derive_rng(s.seed, source.conversation, conv.turn, conv.attempt, "plan")
        if conv.attempt == 0:
            self._planning = conv.model  # whose evidence plan_turn reads
            plan = self.plan_turn(self.archive(conv.model), rng)
            category, role, operator = plan.category, plan.role, plan.operator
            seeds = tuple(Seed.of(e) for e in plan.seeds)
        else:
            last = conv.attempts[conv.attempt - 1]
            category, role, operator = last.category, last.role, "vary"
            severity = last.verdict.severity if last.verdict else 0
            seeds = (
                Seed(
                    category=category,
                    role=role,
                    instruction=last.instruction,
                    utterance=last.utterance,
                    reply=last.reply or "",
                    severity=severity,
                ),
            )
        conv.attempts[conv.attempt] = _Attempt(category, role)
        conv.waiting = False
        notes = tuple(self.notes.get((conv.model, (category, role)), ()))
        self.publish(
            Directive(
                **source.child_ids(
                    campaign=conv.campaign, turn=conv.turn, attempt=conv.attempt, branch=""
                ),
                category=category,
                role=role,
                operator=operator,
                seeds=seeds,
                notes=notes,
                role_conditioning=s.role_conditioning,
                controller=self.name,
            )
        )

    def _next_attempt(self, source: Message, conv: _Conversation) -> None:
        if conv.attempt + 1 < self.run.max_attempts:
            conv.attempt += 1
            self._direct(source, conv)
        else:
            self._commit(source, conv)

    def _commit(self, source: Message, conv: _Conversation) -> None:
        attempts = sorted(conv.attempts.items())
        threshold = self.run.threshold
        judged = [(n, a) for n, a in attempts if a.verdict is not None]
        wins = [(n, a) for n, a in judged if a.verdict and a.verdict.severity >= threshold]
        answered = [(n, a) for n, a in attempts if a.reply is not None]
        if wins:
            chosen = wins[0]
        elif judged:
            chosen = max(judged, key=lambda p: (p[1].verdict.severity if p[1].verdict else 0, p[0]))
        elif answered:
            chosen = answered[-1]
        else:
            errors = [a.error for _, a in attempts if a.error]
            detail = "no attempt of the turn got a counselor reply"
            self._finish(
                source, conv, "failed", f"{detail}; last error: {errors[-1]}" if errors else detail
            )
            return
        number, attempt = chosen
        best = max((a.verdict.severity for _, a in judged if a.verdict), default=None)
        self.publish(
            TurnCommitted(
                **source.child_ids(attempt=conv.attempt, key="commit"),
                committed_attempt=number,
                category=attempt.category,
                role=attempt.role,
                client_text=attempt.utterance,
                counselor_text=attempt.reply or "",
                success=bool(wins),
                best_severity=best,
                counselor_calls=len(answered),
            )
        )
        if conv.turn + 1 < (1 if self.run.single_turn else conv.max_turns):
            conv.turn += 1
            conv.attempt = 0
            conv.attempts = {}
            self._direct(source, conv)
        else:
            self._finish(source, conv, "completed")

    def _finish(self, source: Message, conv: _Conversation, status: str, detail: str = "") -> None:
        del self._convs[source.conversation]
        self.finish(source, conv.campaign, conv.turn, status, detail)

    # -- handlers ------------------------------------------------------------------------------

    @on(ConversationStarted)
    def started(self, msg: ConversationStarted) -> None:
        conv = _Conversation(msg.campaign, msg.counselor_model, max(1, msg.max_turns))
        self._convs[msg.conversation] = conv
        self._direct(msg, conv)

    @on(Verdict, Confirmation)
    def verdict(self, msg: Verdict | Confirmation) -> None:
        """A judged reply: act on the verdict the search acts on (:meth:`SearchRun.acts_on`:
        a candidate waits for its confirmation)."""
        found = self.run.acts_on(msg)
        if found is None or (cur := self._current(msg)) is None:
            return
        msg = found
        conv, attempt = cur
        attempt.verdict = msg
        self.offer(conv.model, attempt, msg)
        if msg.severity >= self.run.threshold:
            self._commit(msg, conv)
        elif self.run.refinement.wants_notes(msg):
            conv.waiting = True  # the refiner answers with RefinerNotes (or CallFailed)
        else:
            self._next_attempt(msg, conv)

    @on(Unjudged)
    def unjudged(self, msg: Unjudged) -> None:
        if self.steers(msg) and (cur := self._current(msg)) is not None:
            self._next_attempt(msg, cur[0])

    @on(RefinerNotes)
    def refined(self, msg: RefinerNotes) -> None:
        cur = self._current(msg)
        if cur is None:
            return
        conv = cur[0]
        kept = self.notes.setdefault(
            (conv.model, (msg.category, msg.role)), deque(maxlen=self.notes_kept)
        )
        kept.extend(msg.notes)
        if conv.waiting:
            self._next_attempt(msg, conv)

    @on(CallFailed)
    def call_failed(self, msg: CallFailed) -> None:
        cur = self._current(msg) if self.steers(msg) else None
        if cur is None:
            return
        conv, attempt = cur
        if msg.owed:  # a role that never answered: the turn stays open for the next run
            self._finish(msg, conv, "failed", unanswered(msg))
            return
        if msg.agent == "refiner":
            if conv.waiting:
                self._next_attempt(msg, conv)  # go on without notes
            return
        attempt.failed = True
        attempt.error = f"{msg.agent} ({msg.model}): {msg.error}"
        log.warning("search.attempt_failed", agent=msg.agent, model=msg.model, error=msg.error)
        self._next_attempt(msg, conv)


def unanswered(msg: CallFailed) -> str:
    """The ``detail`` of a conversation stopped because a role never answered."""
    return (
        f"the {msg.agent} ({msg.model}) did not answer: {msg.error}; turn {msg.turn} is left "
        "open: run the same command again to continue from there"
    )


class MapElitesController(TurnController):
    """The paper's search: MAP-Elites over the taxonomy's cells (see :class:`HarmArchive`).

    Each turn targets a cell by the give-up rule (:class:`TargetingOptions`: empty cells
    first, a cell that resists less and less often; ``give_up = false``: empty cells
    uniformly, the paper's rule) and mutates an elite by an operator whose weights shift with
    coverage (no ``change_role`` without role conditioning: it would be a ``vary``);
    ``qd_search=False`` is the "without QD search" ablation (a fresh instruction for a
    uniformly random cell).
    """

    name = "map-elites"

    def plan_turn(self, archive: HarmArchive, rng: Random) -> Plan:
        odds = self.evidence(self._planning) if self.targeting.give_up else None
        return archive.plan(
            rng,
            no_qd=not self.run.qd_search,
            pick=odds.pick if odds is not None else None,
            role_moves=self.run.role_conditioning,
        )


class RandomController(TurnController):
    """Baseline: every turn targets a uniformly random cell with a fresh instruction (no archive
    guidance); failures are still refined up to ``max_attempts``, like the paper's loop."""

    name = "random"

    def plan_turn(self, archive: HarmArchive, rng: Random) -> Plan:
        category, role = rng.choice(self.cells)
        return Plan(category=category, role=role, operator="fresh")


class SingleTurnController(MapElitesController):
    """Baseline: MAP-Elites with one turn per conversation (no multi-turn build-up)."""

    name = "single-turn"
    single_turn = True
