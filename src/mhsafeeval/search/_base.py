"""What every archive-keeping controller shares: the archives, the attempt texts it records,
offering judged replies to the archive, and ending conversations."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from mhsafeeval.framework import Agent, on
from mhsafeeval.messages import (
    ArchiveUpdated,
    CallFailed,
    ClientUtterance,
    ConversationFinished,
    CounselorReply,
    Elite,
    Instruction,
    Message,
    Operator,
    Unjudged,
    Verdict,
    from_search_judge,
)

from ._types import TargetingOptions
from .archive import CellId, HarmArchive
from .evidence import CellEvidence

__all__ = ["ArchiveController", "AttemptTexts"]


class AttemptTexts:
    """What one attempt (or simulation) said: recorded from the agents' events."""

    __slots__ = ("instruction", "operator", "reply", "utterance", "verdict")

    def __init__(self, operator: Operator = "fresh") -> None:
        self.instruction = ""
        self.operator: Operator = operator
        self.utterance = ""
        self.reply: str | None = None
        self.verdict: Verdict | None = None


class ArchiveController(Agent):
    """Base of the shipped controllers: one :class:`HarmArchive` per counselor model."""

    publishes: ClassVar[tuple[type[Message], ...] | None] = (ArchiveUpdated, ConversationFinished)

    @staticmethod
    def steers(msg: Message) -> bool:
        """Whether a judge's answer steers the search: it comes from the search's judge
        (:func:`~mhsafeeval.messages.from_search_judge`). Any other message does. A second
        judge added to the graph rates the same replies for the report only."""
        if isinstance(msg, Verdict | Unjudged) or (
            isinstance(msg, CallFailed) and msg.agent == "judge"
        ):
            return from_search_judge(msg)
        return True

    name: ClassVar[str] = "base"

    def __init__(
        self, cells: Iterable[CellId], threshold: int, targeting: TargetingOptions | None = None
    ) -> None:
        super().__init__()
        self.cells = list(cells)
        self._cell_set = set(self.cells)
        self.threshold = threshold
        self.targeting = targeting or TargetingOptions()
        self.archives: dict[str, HarmArchive] = {}
        self._evidence: dict[str, CellEvidence] = {}

    def archive(self, model: str) -> HarmArchive:
        """The harm archive of one counselor model."""
        if model not in self.archives:
            self.archives[model] = HarmArchive(self.cells, threshold=self.threshold)
        return self.archives[model]

    def evidence(self, model: str) -> CellEvidence:
        """The judged attempts at each cell with one counselor model, and their results (the
        give-up rule's evidence: "tried 40 times, never harmed" is a finding too)."""
        if model not in self._evidence:
            t = self.targeting
            self._evidence[model] = CellEvidence(
                t.prior_successes, t.prior_failures, borrow=t.borrow
            )
        return self._evidence[model]

    def texts(self, msg: Message) -> AttemptTexts | None:
        """The record of the attempt ``msg`` belongs to, or None (not ours, or stale)."""
        raise NotImplementedError

    @on(Instruction)
    def _instruction(self, msg: Instruction) -> None:
        if (texts := self.texts(msg)) is not None:
            texts.instruction, texts.operator = msg.text, msg.operator

    @on(ClientUtterance)
    def _utterance(self, msg: ClientUtterance) -> None:
        if (texts := self.texts(msg)) is not None:
            texts.utterance = msg.text

    @on(CounselorReply)
    def _reply(self, msg: CounselorReply) -> None:
        if (texts := self.texts(msg)) is not None:
            texts.reply = msg.text

    def offer(self, model: str, texts: AttemptTexts, verdict: Verdict) -> None:
        """Count the attempt in the model's :meth:`evidence` and offer the judged reply to its
        archive; publish the elite if it improved."""
        if (verdict.category, verdict.role) not in self._cell_set:
            return
        elite = Elite(
            category=verdict.category,
            role=verdict.role,
            severity=verdict.severity,
            instruction=texts.instruction,
            utterance=texts.utterance,
            reply=texts.reply or "",
            label=verdict.label,
            reasoning=verdict.reasoning,
            evidence=verdict.evidence,
            verdict_id=verdict.id,
            conversation=verdict.conversation,
            turn=verdict.turn,
            attempt=verdict.attempt,
            operator=texts.operator,
            counselor_model=model,
        )
        archive, cell = self.archive(model), (verdict.category, verdict.role)
        filled = archive.is_filled(cell)
        kept = archive.offer(elite)
        success = verdict.severity >= self.threshold
        self.evidence(model).record(cell, success=success, filled=filled, improved=kept and filled)
        if kept:
            # key: two judges improving one attempt's cell give two distinct events (ids).
            self.publish(
                ArchiveUpdated(
                    **verdict.child_ids(key=f"archive:{verdict.key}"),
                    counselor_model=model,
                    elite=elite,
                )
            )

    def finish(
        self, source: Message, campaign: str, turn: int, status: str, detail: str = ""
    ) -> None:
        """Publish the conversation's one ConversationFinished."""
        self.publish(
            ConversationFinished(
                campaign=campaign,
                conversation=source.conversation,
                turn=turn,
                causation=source.id,
                turns=turn + (status == "completed"),
                status=status,
                detail=detail,
            )
        )
