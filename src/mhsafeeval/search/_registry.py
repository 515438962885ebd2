"""The controller registry: each controller declared once, with its options and what it needs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from mhsafeeval.config import convert_table
from mhsafeeval.framework import Agent, Registry

from ._controller import MapElitesController, RandomController, SingleTurnController
from ._protocol import SearchControllerFactory
from ._types import NoOptions, SearchRun, TargetingOptions
from ._uct_controller import UCTController, UCTOptions
from .archive import CellId

__all__ = ["CONTROLLERS", "ControllerSpec", "controller", "controller_options"]

F = TypeVar("F", bound=SearchControllerFactory)


@dataclass(frozen=True)
class ControllerSpec:
    """A registered controller: how to build it and what the campaign must know of it.

    Attributes:
        factory: ``factory(cells, run, options)`` returns the controller (an Agent).
        options: The msgspec Struct its ``[search]`` table decodes to (:func:`controller_options`).
        uses_refiner: Whether the campaign runs a refiner, whose notes the controller then
            awaits below the threshold; or ``uses_refiner(options)``, when its options decide
            (:meth:`refines`).
        attempts: ``attempts(options, run)``: the fewest and most attempts (counselor calls)
            of one turn, for estimates; None for the refinement loop's ``(1, max_attempts)``.
    """

    factory: SearchControllerFactory
    options: type[msgspec.Struct] = NoOptions
    uses_refiner: bool | Callable[[Any], bool] = True
    attempts: Callable[[Any, SearchRun], tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.options, type) and issubclass(self.options, msgspec.Struct)):
            raise TypeError(
                f"a controller's options must be a msgspec Struct, got {self.options!r}"
            )
        # The registry describes each plugin by its docstring: the factory's, not this class's.
        object.__setattr__(self, "__doc__", self.factory.__doc__)

    def __call__(self, cells: Iterable[CellId], run: SearchRun, options: Any) -> Agent:
        """Build the controller: ``factory(cells, run, options)``."""
        return self.factory(cells, run, options)

    def refines(self, options: msgspec.Struct) -> bool:
        """Whether a campaign with these options runs the refiner."""
        if callable(self.uses_refiner):
            return bool(self.uses_refiner(options))
        return self.uses_refiner

    def turn_attempts(self, options: msgspec.Struct, run: SearchRun) -> tuple[int, int]:
        """The fewest and most attempts one turn makes with these options."""
        if self.attempts is not None:
            return self.attempts(options, run)
        return 1, run.max_attempts


CONTROLLERS: Registry[ControllerSpec] = Registry(
    "controller", "mhsafeeval.controllers", entry_type=ControllerSpec
)
"""Every controller by name: ``CONTROLLERS.get(name)`` is its :class:`ControllerSpec`."""


def controller(
    name: str,
    *,
    options: type[msgspec.Struct] = NoOptions,
    uses_refiner: bool | Callable[[Any], bool] = True,
    attempts: Callable[[Any, SearchRun], tuple[int, int]] | None = None,
    replace: bool = False,
) -> Callable[[F], F]:
    """Declare a search controller factory ``(cells, run, options) -> Agent`` as ``name``.

    ``options`` is the msgspec Struct its ``[search]`` table decodes to (checked by
    ``mhsafeeval check``); the other arguments are :class:`ControllerSpec`'s. Returns the
    factory unchanged.

    Example:
        >>> from mhsafeeval.search import CONTROLLERS, MapElitesController
        >>> @controller("doc-map-elites")
        ... class MyMapElites(MapElitesController):
        ...     '''MAP-Elites under a name of its own (override plan_turn to steer it).'''
        >>> spec = CONTROLLERS.get("doc-map-elites")
        >>> spec.factory is MyMapElites, spec.uses_refiner, spec.options.__name__
        (True, True, 'NoOptions')
    """

    def add(factory: F) -> F:
        spec = ControllerSpec(factory, options, uses_refiner, attempts)
        CONTROLLERS.declare(name, spec, factory, replace=replace)
        return factory

    return add


def controller_options(
    name: str, table: Mapping[str, Any], source: str | Path | None = None
) -> msgspec.Struct:
    """The ``[search]`` table decoded into controller ``name``'s options.

    A controller accepts the uct controller's keys it does not read, checked the same way,
    and ignores them: before options were per controller, any config could set them.

    Example:
        >>> controller_options("uct", {"simulations": 8}).simulations
        8
        >>> controller_options("map-elites", {"simulations": 8, "prior_failures": 3.0})
        TargetingOptions(give_up=True, prior_successes=1.0, prior_failures=3.0, borrow=True)
        >>> controller_options("map-elites", {"simulations": 0}, "c.toml")
        Traceback (most recent call last):
        ...
        mhsafeeval.errors.InputError: c.toml: search.simulations: must be >= 1

    Raises:
        InputError: a bad key or value, naming ``source`` and the key path
            (``search.simulations``).
        PluginNotFound: no controller of that name.
    """
    kind = CONTROLLERS.get(name).options
    own = {f.encode_name for f in msgspec.structs.fields(kind)}
    tree = {f.encode_name for f in msgspec.structs.fields(UCTOptions)}
    ignored = {k: v for k, v in table.items() if k not in own and k in tree}
    if ignored:
        convert_table(ignored, UCTOptions, source, "search")
    data = {k: v for k, v in table.items() if k not in ignored}
    return convert_table(data, kind, source, "search")


controller("map-elites", options=TargetingOptions)(MapElitesController)
controller("random")(RandomController)
controller("single-turn", options=TargetingOptions)(SingleTurnController)
# uct runs the refiner when it reads its notes (UCTOptions.notes, the default): the notes on a
# turn's first simulations that fell short go with later directives at the same cell.
controller(
    "uct",
    options=UCTOptions,
    uses_refiner=UCTOptions.reads_notes,
    attempts=UCTOptions.turn_attempts,
)(UCTController)
