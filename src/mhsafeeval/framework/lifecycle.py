"""The lifecycle messages every graph shares: how a conversation ends and how a run ends.

The engine publishes and reads these (and ``HandlerFailed``) and no other message type: a
graph's own vocabulary is its own (:mod:`mhsafeeval.messages` is the MHSafeEval campaign's).
"""

from __future__ import annotations

from ._message import Message

__all__ = ["CampaignFinished", "ConversationFinished"]


class CampaignFinished(Message, frozen=True, tag="campaign.finished"):
    """A run of a campaign ended: ``status`` is completed, interrupted, budget or failed."""

    record = True

    status: str
    run: int = 0
    detail: str = ""


class ConversationFinished(Message, frozen=True, tag="conversation.finished"):
    """A conversation ended: ``status`` is completed, failed or stopped. Every conversation of
    a graph ends with exactly one, published by one of its agents (or by the engine, for a
    conversation that failed or stalled)."""

    turns: int
    status: str = "completed"
    detail: str = ""
