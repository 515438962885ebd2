"""Search: the pure MAP-Elites archive and the controllers that steer each conversation.

Controllers are plugins registered by name (``@controller("map-elites")``) and found through the
``mhsafeeval.controllers`` entry-point group too. A factory takes ``(cells, settings)`` and returns
an Agent that handles judge events and publishes directives.
"""

from collections.abc import Callable, Iterable
from typing import TypeVar

from mhsafeeval.runtime import Agent, Registry

from ._controller import (
    LoopSettings,
    MapElitesController,
    RandomController,
    SingleTurnController,
    TurnController,
)
from ._protocol import SearchController, SearchControllerFactory
from ._uct_controller import UCTController
from .archive import OPERATOR_WEIGHTS, CellId, Elite, HarmArchive, Plan, operator_weights
from .rng import derive_rng, derive_seed
from .uct import Action, ActionStats, NodeId, Path, Sample, UCTSettings, UCTTree, reward

__all__ = [
    "CONTROLLERS",
    "OPERATOR_WEIGHTS",
    "Action",
    "ActionStats",
    "CellId",
    "ControllerFactory",
    "Elite",
    "HarmArchive",
    "LoopSettings",
    "MapElitesController",
    "NodeId",
    "Path",
    "Plan",
    "RandomController",
    "Sample",
    "SearchController",
    "SearchControllerFactory",
    "SingleTurnController",
    "TurnController",
    "UCTController",
    "UCTSettings",
    "UCTTree",
    "controller",
    "derive_rng",
    "derive_seed",
    "operator_weights",
    "reward",
]

ControllerFactory = Callable[[Iterable[CellId], LoopSettings], Agent]
F = TypeVar("F", bound=ControllerFactory)

CONTROLLERS: Registry[ControllerFactory] = Registry("controller", "mhsafeeval.controllers")


def controller(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Register a search controller factory ``(cells, settings) -> Agent`` under ``name``."""
    return CONTROLLERS.register(name, replace=replace)  # type: ignore[return-value]


controller("map-elites")(MapElitesController)
controller("random")(RandomController)
controller("single-turn")(SingleTurnController)
controller("uct")(UCTController)
