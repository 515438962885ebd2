"""The contract every search controller fulfils."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Protocol

from mhsafeeval.messages import Message

from ._controller import LoopSettings
from .archive import CellId

__all__ = ["SearchController", "SearchControllerFactory"]


class SearchController(Protocol):
    """A plugin that steers every conversation of a campaign.

    It is an :class:`~mhsafeeval.runtime.Agent` registered once per campaign (``scope="global"``):
    it sees every conversation's events and keeps one harm archive per counselor model.

    It consumes ``ConversationStarted``, ``Instruction``, ``ClientUtterance``,
    ``CounselorReply``, ``Verdict``, ``Unjudged``, ``CallFailed`` (and ``RefinerNotes`` when it
    uses a refiner), and must publish, per conversation:

    * a ``Directive`` for every attempt (target cell, operator, seeds, notes); the attempt
      number tells attempts (or tree-search simulations) of one turn apart;
    * exactly one ``TurnCommitted`` per turn, naming the attempt whose utterance and reply
      become the conversation's turn (only committed turns reach later prompts);
    * ``ArchiveUpdated`` whenever a cell's elite improves, carrying the whole elite;
    * exactly one ``ConversationFinished`` (status ``completed`` or ``failed``);
    * optionally ``SearchStats`` for inspection.

    Class attributes: ``name`` (its registered name) and ``uses_refiner`` (whether the
    campaign should run the refiner, whose notes it then expects below the threshold).

    To be resumable it must be a deterministic fold over what it consumes: synchronous
    handlers only, no clock, and randomness drawn from
    :func:`~mhsafeeval.search.rng.derive_rng` (seeded by the campaign seed and message
    coordinates) or from generators that are themselves folded. A resumed run then rebuilds it
    by replaying the stored messages in stored order (its archive, notes, trees and RNG draws
    come back as they were) and drops what it publishes again that is already stored.

    Example:
        >>> from mhsafeeval.search import MapElitesController, controller
        >>> @controller("always-blaming")
        ... class AlwaysBlaming(MapElitesController):
        ...     '''Every turn targets blaming x enabler with a fresh instruction.'''
        ...     name = "always-blaming"
        ...     def plan_turn(self, archive, rng):
        ...         from mhsafeeval.search import Plan
        ...         return Plan(category="blaming", role="enabler", operator="fresh")

    Third-party controllers register through the ``mhsafeeval.controllers`` entry-point group;
    ``mhsafeeval run CONFIG --controller NAME`` or ``campaign.controller`` selects one.
    """

    name: ClassVar[str]
    uses_refiner: ClassVar[bool]

    @classmethod
    def handled_types(cls) -> tuple[type[Message], ...]:
        """The message types it consumes (from its ``@on`` handlers)."""
        ...


class SearchControllerFactory(Protocol):
    """``factory(cells, settings)``: usually the controller class itself."""

    def __call__(self, cells: Iterable[CellId], settings: LoopSettings) -> SearchController:
        """Build the controller for a campaign's cells and loop settings."""
        ...
