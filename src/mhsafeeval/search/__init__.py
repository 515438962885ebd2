"""Search: the controllers that steer each conversation, and the pure cores they keep.

Controllers are plugins declared by name with their options (``@controller("uct",
options=UCTOptions, uses_refiner=UCTOptions.reads_notes)``) and found through the
``mhsafeeval.controllers`` entry-point group too. ``CONTROLLERS.get(name)`` is the
:class:`ControllerSpec`; the campaign decodes ``[search]`` with :func:`controller_options` and
builds the controller as ``spec.factory(cells, run, options)`` (a :class:`SearchRun` and that
options struct). The contract a controller fulfils is :class:`SearchController`.

The pure cores stay importable from their modules: :mod:`mhsafeeval.search.archive` (the
MAP-Elites archive), :mod:`mhsafeeval.search.uct` (the UCT tree),
:mod:`mhsafeeval.search.evidence` (the give-up rule and the archive gain both controllers
optimise) and :mod:`mhsafeeval.search.rng` (the seeded random streams every controller draws
from).
"""

from ._controller import MapElitesController
from ._protocol import SearchController
from ._registry import CONTROLLERS, ControllerSpec, controller, controller_options
from ._types import SearchRun
from .archive import Plan

__all__ = [
    "CONTROLLERS",
    "ControllerSpec",
    "MapElitesController",
    "Plan",
    "SearchController",
    "SearchRun",
    "controller",
    "controller_options",
]
