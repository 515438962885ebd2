"""The contract every search controller fulfils."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Protocol

from mhsafeeval.framework import Agent
from mhsafeeval.messages import Message

from ._types import SearchRun
from .archive import CellId

__all__ = ["SearchController", "SearchControllerFactory"]


class SearchController(Protocol):
    """A plugin that steers every conversation of a campaign.

    It is an :class:`~mhsafeeval.framework.Agent` registered once per campaign (``scope="global"``):
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

    It is declared with :func:`~mhsafeeval.search.controller`: its name, its options (a
    msgspec Struct that the ``[search]`` table decodes to, checked by ``mhsafeeval check``
    with the file and key path of any mistake), whether it uses a refiner (the campaign then
    runs one, and the controller waits for its notes after exactly the verdicts that
    :attr:`SearchRun.refinement <mhsafeeval.search.SearchRun.refinement>` says get them), and
    how many attempts a turn makes. The campaign builds it as ``factory(cells, run, options)``:
    the taxonomy's cells, the :class:`~mhsafeeval.search.SearchRun` every controller shares
    (seed, ``max_attempts``, ``threshold``, ablations) and its own options.

    To be resumable it must be a deterministic fold over what it consumes: synchronous
    handlers only, no clock, and randomness drawn from
    :func:`~mhsafeeval.search.rng.derive_rng` (seeded by ``run.seed`` and message
    coordinates) or from generators that are themselves folded. A resumed run then rebuilds it
    by replaying the stored messages in stored order (its archive, notes, trees and RNG draws
    come back as they were) and drops what it publishes again that is already stored.

    Example:
        >>> import msgspec
        >>> from mhsafeeval.search import (
        ...     CONTROLLERS, MapElitesController, Plan, SearchRun, controller, controller_options
        ... )
        >>> class OneCategory(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        ...     category: str = "blaming"
        >>> @controller("one-category", options=OneCategory)
        ... class OneCategoryController(MapElitesController):
        ...     '''Every turn targets ``[search] category`` x enabler with a fresh instruction.'''
        ...     name = "one-category"
        ...     def __init__(self, cells, run=None, options=None):
        ...         super().__init__(cells, run)
        ...         self.category = (options or OneCategory()).category
        ...     def plan_turn(self, archive, rng):
        ...         return Plan(category=self.category, role="enabler", operator="fresh")
        >>> spec = CONTROLLERS.get("one-category")
        >>> options = controller_options("one-category", {"category": "gaslighting"})
        >>> ctl = spec.factory([("gaslighting", "enabler")], SearchRun(seed=1), options)
        >>> spec.uses_refiner, ctl.category
        (True, 'gaslighting')
        >>> controller_options("one-category", {"categroy": "toxic"}, "c.toml")
        Traceback (most recent call last):
        ...
        mhsafeeval.errors.InputError: c.toml: search.categroy: unknown field

    Third-party controllers register through the ``mhsafeeval.controllers`` entry-point group
    (naming the decorated factory); ``mhsafeeval run CONFIG --controller NAME`` or
    ``campaign.controller`` selects one.
    """

    name: ClassVar[str]

    @classmethod
    def handled_types(cls) -> tuple[type[Message], ...]:
        """The message types it consumes (from its ``@on`` handlers)."""
        ...


class SearchControllerFactory(Protocol):
    """``factory(cells, run, options)``: usually the controller class itself."""

    def __call__(self, cells: Iterable[CellId], run: SearchRun, options: Any) -> Agent:
        """Build the controller (an Agent that is a :class:`SearchController`) for a
        campaign's cells, its run facts and its own options."""
        ...
