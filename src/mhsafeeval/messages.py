"""The message vocabulary of a campaign: every event that flows on the bus and is stored.

Tags are a stored schema: once a database holds a tag it keeps its meaning forever. Add fields
only with defaults; never rename or reuse a tag. Correlation fields (``campaign``,
``conversation``, ``turn``, ``attempt``, ``branch``, ``key``, ``causation``) come from
:class:`~mhsafeeval.runtime.Message`.

One turn of the closed loop, as messages::

    Directive -> Instruction -> ClientUtterance -> CounselorReply -> Verdict | Unjudged
    (severity < threshold) -> RefinerNotes -> Directive (attempt + 1) ... -> TurnCommitted

Any model call that finally fails becomes a :class:`CallFailed` (the attempt is not counted, and
never counted as safe).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from mhsafeeval.runtime import HandlerFailed, Message

__all__ = [
    "ArchiveUpdated",
    "CallFailed",
    "CampaignFinished",
    "CampaignStarted",
    "ClientUtterance",
    "ConversationStarted",
    "CounselorReply",
    "Directive",
    "HandlerFailed",
    "Instruction",
    "Message",
    "Operator",
    "RefinerNotes",
    "SearchStats",
    "TurnCommitted",
    "Unjudged",
    "Usage",
    "Verdict",
]

Operator = Literal["fresh", "change_category", "change_role", "crossover", "vary"]


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """What one model call cost."""

    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    attempts: int = 1


class CampaignStarted(Message, frozen=True, tag="campaign.started"):
    """A campaign (or a resumed run of one) began. ``config`` is the config as TOML text."""

    config: str = ""
    run: int = 0


class CampaignFinished(Message, frozen=True, tag="campaign.finished"):
    """A run of a campaign ended: ``status`` is completed, interrupted, budget or failed."""

    status: str
    run: int = 0
    detail: str = ""


class ConversationStarted(Message, frozen=True, tag="conversation.started"):
    """A conversation between one client profile and one counselor model began."""

    counselor_model: str
    profile_id: str
    index: int = 0


class Directive(Message, frozen=True, tag="search.directive"):
    """A search controller's choice for the next attempt: target cell and strategy."""

    category: str
    role: str
    operator: Operator = "fresh"
    seed_elites: tuple[str, ...] = ()
    instruction: str = ""
    controller: str = ""


class Instruction(Message, frozen=True, tag="mutator.instruction"):
    """The instruction the client will act out in this attempt."""

    category: str
    role: str
    text: str
    operator: Operator = "fresh"
    usage: Usage | None = None


class ClientUtterance(Message, frozen=True, tag="client.utterance"):
    """What the simulated client says in this attempt."""

    text: str
    usage: Usage | None = None


class CounselorReply(Message, frozen=True, tag="counselor.reply"):
    """The model under test's answer to the client's utterance."""

    text: str
    finish_reason: str = "stop"
    usage: Usage | None = None


class Verdict(Message, frozen=True, tag="judge.verdict"):
    """The judge's scoring of one counselor reply for the target cell."""

    category: str
    role: str
    severity: int
    label: str
    reasoning: str
    evidence: tuple[str, ...] = ()
    refused: bool = False
    understood: bool = True
    judge: str = ""
    usage: Usage | None = None


class Unjudged(Message, frozen=True, tag="judge.unjudged"):
    """No valid verdict could be had: excluded from rates, reported as a count, never 'safe'."""

    category: str
    role: str
    reason: str
    raw: str = ""
    judge: str = ""


class CallFailed(Message, frozen=True, tag="call.failed"):
    """A model call that finally failed; the attempt it belonged to does not count."""

    agent: str
    model: str
    error: str
    attempts: int = 0
    retryable: bool = True
    status: int | None = None


class RefinerNotes(Message, frozen=True, tag="refiner.notes"):
    """Strategy notes for a cell, written from the judge's reasoning text only."""

    category: str
    role: str
    notes: tuple[str, ...]
    usage: Usage | None = None


class TurnCommitted(Message, frozen=True, tag="turn.committed"):
    """Which attempt (and branch) becomes the conversation's turn."""

    committed_attempt: int
    committed_branch: str = ""
    success: bool = False
    best_severity: int | None = None
    counselor_calls: int = 0


class ArchiveUpdated(Message, frozen=True, tag="archive.updated"):
    """A cell of a counselor model's harm archive has a new elite."""

    counselor_model: str
    category: str
    role: str
    severity: int
    elite: str  # id of the Verdict event that made it an elite


class SearchStats(Message, frozen=True, tag="search.stats"):
    """A search controller's statistics after a step (tree nodes, visits, values)."""

    controller: str
    stats: dict[str, float] = {}
    detail: str = ""
