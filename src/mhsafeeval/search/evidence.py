"""What the search learned about each cell: the give-up rule and the worth of an archive gain.

Pure and synchronous, shared by the MAP-Elites and UCT controllers.

*The give-up rule.* Every judged attempt at a cell is a Bernoulli trial of that cell's success
rate; :class:`CellEvidence` keeps a Beta posterior on it (``Beta(a + successes, b +
failures)``). Both controllers add to that prior (``[search] borrow``, the default) what the
cell's neighbours showed, as far as they agree (:func:`neighbours`: its category's other cells
and its role's, each group worth as many attempts as an empirical-Bayes estimate of how much
its cells' rates spread allows, :func:`agreement`): a category whose cells all resist makes its
untried cells unpromising, one that mixes easy and never-harmable cells says little about them,
and a cell that keeps resisting among cells that give way is judged by its own failures.
map-elites centres the prior on the rate of every attempt so far (``population``), uct on the
even prior: measured over 20 seeds (docs/campaigns.md, issue 34), that raised map-elites'
successes per call above random's in every world (fixed 0.080 to 0.121, random 0.107), at a
cost of true cells early in the layered world, and centring uct's prior the same way cost it a
cell at 100 and at 200 calls.
A search targets the cell whose *Thompson draw* from that posterior, times what a success there
would add to the archive (:func:`worth`), is highest (:meth:`CellEvidence.value`). A cell
nobody tried draws from its prior alone, so empty cells come first unless their neighbours
resisted; every failure shifts its posterior down, so a cell that resists gets a shrinking
share of the targets, never zero: evidence, not a fixed cut-off, decides when to give up.

*The archive gain* (:func:`gain`), what uct's simulations earn and what both controllers
expect of a target: 1 for a success in a cell the archive has not filled; ``IMPROVEMENT *
(severity - best) / (5 - threshold)`` for a higher severity in a filled cell; 0 for a failure
and for a success that adds no severity (:data:`REPEAT`): what the tool reports is its cells
and their severities, and another example of a known harm changes neither. In a filled cell a
success is worth one severity step times the chance that it beats every success seen there,
``1 / (successes + 1)`` (:func:`worth`).

Measured (benchmarks/search.py, 20 seeds, issue 34): with a repeat earning 0.2 and a uniform
prior on each filled cell's chance of improving, uct spent half of its calls on cells it had
filled and map-elites pressed empty cells that never gave way; with the rules above uct (which
also commits a turn at its first success, after at most 5 simulations, and reads the
refiner's notes) finds at least as many true cells as map-elites at 100, 200 and 400 calls of
the layered world (the tables are in docs/campaigns.md).

Example:
    >>> from random import Random
    >>> odds = CellEvidence()
    >>> for _ in range(40):
    ...     odds.record(("toxic_language", "perpetrator"), success=False)
    >>> odds.counts(("toxic_language", "perpetrator"))
    (0, 40)
    >>> rng = Random(0)
    >>> tried = sum(odds.draw(("toxic_language", "perpetrator"), rng) > 0.2 for _ in range(1000))
    >>> fresh = sum(odds.draw(("blaming", "enabler"), rng) > 0.2 for _ in range(1000))
    >>> tried < 5 < 700 < fresh
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from random import Random
from typing import Final

from .archive import CellId, HarmArchive

__all__ = [
    "IMPROVEMENT",
    "REPEAT",
    "SEED",
    "CellEvidence",
    "agreement",
    "gain",
    "neighbours",
    "step",
    "thompson",
    "worth",
]

IMPROVEMENT: Final[float] = 0.5
"""What raising a filled cell from the threshold to severity 5 earns (a new cell earns 1)."""
REPEAT: Final[float] = 0.0
"""What a success that adds no severity earns: nothing, since the tool reports cells and their
severities and another example of a known harm changes neither (map-elites' targeting still
values it as a seed for mutations: :data:`SEED`)."""

SEED: Final[float] = 0.2
"""What map-elites' targeting expects of a success in a filled cell that adds no severity:
another elite to mutate from. Not a reward (uct earns :data:`REPEAT` for it): without it the
give-up rule would send every target to the cells that never gave way once the others are
filled (tests/test_search_qd.py)."""


def gain(severity: int, *, threshold: int, best: int | None) -> float:
    """What a judged reply of ``severity`` adds to its cell, whose filled elite has severity
    ``best`` (None: the cell is not filled): 1 for a new cell; in a filled cell
    :data:`REPEAT`, plus a share of :data:`IMPROVEMENT` for a higher severity; 0 for a
    failure.

    Example:
        >>> gain(2, threshold=2, best=None), gain(5, threshold=2, best=2)
        (1.0, 0.5)
        >>> gain(2, threshold=2, best=3), gain(1, threshold=2, best=None)
        (0.0, 0.0)
    """
    if severity < threshold:
        return 0.0
    if best is None:
        return 1.0
    more = max(0, severity - best)
    return REPEAT + IMPROVEMENT * more / max(1, 5 - threshold)


def step(archive: HarmArchive, cell: CellId) -> float:
    """What one severity step up adds to a filled ``cell`` beyond a repeat (0 at 5)."""
    best = archive.elite(cell)
    if best is None or best.severity >= 5:
        return 0.0
    return IMPROVEMENT / max(1, 5 - archive.threshold)


def thompson(
    rng: Random,
    wins: float,
    tries: float,
    prior: tuple[float, float] = (1.0, 1.0),
) -> float:
    """A draw from ``Beta(a + wins, b + tries - wins)``, ``(a, b) = prior``."""
    a, b = prior
    return rng.betavariate(a + wins, b + max(0.0, tries - wins))


def agreement(
    counts: Iterable[tuple[int, int]], own: tuple[int, int] = (0, 0)
) -> tuple[float, float]:
    """What a group of cells (a category's, or a role's) says about one of them: the rate of
    the group's other cells and the weight, in attempts, that it deserves, from the other
    cells' ``(successes, attempts)`` (``counts``) and the cell's own (``own``).

    An empirical-Bayes (beta-binomial) estimate by the method of moments: the cells' rates
    scatter around the group's rate ``m`` by their binomial noise plus a spread ``tau2``
    between the cells, judged over the whole group, the cell itself included; a group whose
    cells agree (``tau2 <= 0``) is worth all its other cells' attempts, one whose cells
    disagree only ``m (1 - m) / tau2 - 1`` (the concentration of the beta the cells' rates are
    drawn from): a category that mixes easy and never-harmed cells says little about its
    untried ones, one whose cells all resist (or all give way) says a lot, and a cell that
    keeps resisting among cells that give way soon shows the spread that lets its own
    failures count. One tried cell shows no spread, and counts in full.

    Example:
        >>> centre, weight = agreement([(4, 8), (3, 8), (5, 8)])  # they agree
        >>> round(centre, 2), weight
        (0.5, 24.0)
        >>> centre, weight = agreement([(8, 8), (0, 8), (0, 8)])  # they disagree
        >>> round(centre, 2), round(weight, 2)
        (0.34, 0.16)
        >>> round(agreement([(3, 10), (3, 10)], own=(0, 20))[1], 1)  # it stands out: not 20
        9.6
        >>> agreement([])
        (0.5, 0.0)
    """
    others = [(w, t) for w, t in counts if t > 0]
    n = sum(t for _, t in others)
    if n == 0:
        return 0.5, 0.0
    m = (sum(w for w, _ in others) + 0.5) / (n + 1)
    group = others + ([own] if own[1] > 0 else [])
    if len(group) < 2:
        return m, float(n)
    total = sum(t for _, t in group)
    rate = (sum(w for w, _ in group) + 0.5) / (total + 1)
    spread = sum(t * (w / t - rate) ** 2 for w, t in group) / total
    tau2 = spread - rate * (1 - rate) * len(group) / total  # less the binomial noise
    if tau2 <= 0:
        return m, float(n)
    return m, min(float(n), max(0.0, rate * (1 - rate) / tau2 - 1))


def neighbours(
    counts: Mapping[CellId, tuple[int, int]],
    cell: CellId,
    prior: tuple[float, float],
    *,
    population: bool = False,
) -> tuple[float, float]:
    """The cell's Beta prior ``(a, b)``: ``prior`` plus, from its category's other cells and
    from its role's, as many attempts at their rate as they agree on, the cell included
    (:func:`agreement`); ``counts``: ``(successes, attempts)`` by cell. ``population``: centre
    ``prior`` (its strength ``a + b`` kept) on the rate of every attempt so far, the level
    above a category and a role, so that a category nobody tried is expected to give way as
    often as the cells tried so far, not half the time (map-elites' choice, measured:
    :class:`CellEvidence`).

    Example:
        >>> seen = {("blaming", "enabler"): (0, 6), ("blaming", "instigator"): (0, 6)}
        >>> a, b = neighbours(seen, ("blaming", "facilitator"), (1.0, 1.0))
        >>> round(a / (a + b), 2)  # its category resisted: an untried cell looks unpromising
        0.1
        >>> seen[("blaming", "instigator")] = (6, 6)  # ... unless its cells disagree
        >>> a, b = neighbours(seen, ("blaming", "facilitator"), (1.0, 1.0))
        >>> round(a + b, 1)  # nearly the even prior's strength alone
        2.2
        >>> a, b = neighbours({("blaming", "enabler"): (1, 9)}, ("gaslighting", "perpetrator"),
        ...                   (1.0, 1.0), population=True)
        >>> round(a / (a + b), 2)  # no neighbour tried: the rate of every attempt so far
        0.18
    """
    a, b = prior
    if population:
        wins = sum(w for w, _ in counts.values())
        tries = sum(t for _, t in counts.values())
        rate = (wins + a) / (tries + a + b)
        a, b = rate * (prior[0] + prior[1]), (1 - rate) * (prior[0] + prior[1])
    own = counts.get(cell, (0, 0))
    for k in (0, 1):
        group = [n for c, n in counts.items() if c != cell and c[k] == cell[k]]
        centre, weight = agreement(group, own)
        a, b = a + weight * centre, b + weight * (1 - centre)
    return a, b


def worth(archive: HarmArchive, cell: CellId, successes: int) -> float:
    """What a success at ``cell`` is expected to add to ``archive``, given the ``successes``
    judged there so far: 1 for a cell not filled; for a filled one :data:`REPEAT` plus one
    severity step (:func:`step`) times the chance that it beats them all, ``1 / (successes +
    1)`` (of ``n + 1`` exchangeable draws, the last is the highest with chance at most ``1 /
    (n + 1)``): a cell keeps its value while it is young and loses it as its successes show
    what it gives, without a prior that claims anything about improvements."""
    if not archive.is_filled(cell):
        return 1.0
    return REPEAT + step(archive, cell) / (max(1, successes) + 1)


class CellEvidence:
    """The attempts at each cell and their results, with Beta posteriors on what they earn.

    Two rates per cell, each with a ``Beta(prior_successes, prior_failures)`` prior: its
    success rate (what an attempt at an empty cell may earn: a new cell), and, once filled, its
    improvement rate (attempts since then that raised its severity: a success that adds
    nothing is not worth pressing for).

    Args:
        prior_successes: ``a`` of each rate's ``Beta(a, b)`` prior.
        prior_failures: ``b`` of that prior.
        borrow: Each cell's success-rate prior also borrows from its category's and its
            role's cells as far as they agree, centred on the rate of every attempt so far
            (:func:`neighbours` with ``population``); False: the even prior alone.
    """

    def __init__(
        self, prior_successes: float = 1.0, prior_failures: float = 1.0, *, borrow: bool = False
    ) -> None:
        if not (prior_successes > 0 and prior_failures > 0):
            raise ValueError("the Beta prior's parameters must be positive")
        self.prior = (prior_successes, prior_failures)
        self.borrow = borrow
        self._counts: dict[CellId, list[int]] = {}  # successes, attempts, gains, attempts filled

    def record(
        self, cell: CellId, *, success: bool, filled: bool = False, improved: bool = False
    ) -> None:
        """Count one judged attempt at ``cell``; ``filled``: the cell was filled before it,
        ``improved``: it raised the cell's severity."""
        slot = self._counts.setdefault(cell, [0, 0, 0, 0])
        slot[0] += success
        slot[1] += 1
        if filled:
            slot[2] += improved
            slot[3] += 1

    def counts(self, cell: CellId) -> tuple[int, int]:
        """``(successes, attempts)`` at ``cell``."""
        wins, tries, _, _ = self._counts.get(cell, (0, 0, 0, 0))
        return wins, tries

    def gains(self, cell: CellId) -> tuple[int, int]:
        """``(improvements, attempts)`` at ``cell`` since it was filled."""
        _, _, gained, tries = self._counts.get(cell, (0, 0, 0, 0))
        return gained, tries

    def prior_of(
        self, cell: CellId, seen: Mapping[CellId, tuple[int, int]] | None = None
    ) -> tuple[float, float]:
        """The Beta prior of the cell's success rate: the options', plus with ``borrow`` what
        its neighbours in ``seen`` (default: every cell counted) agree on."""
        if not self.borrow:
            return self.prior
        if seen is None:
            seen = {c: self.counts(c) for c in self._counts}
        return neighbours(seen, cell, self.prior, population=True)

    def draw(
        self,
        cell: CellId,
        rng: Random,
        *,
        pending: int = 0,
        seen: Mapping[CellId, tuple[int, int]] | None = None,
    ) -> float:
        """A Thompson draw of the cell's success rate from its posterior.

        ``pending``: attempts still in flight, counted as failures until they are judged (a
        virtual loss); ``seen``: the counts :meth:`prior_of` borrows from.
        """
        wins, tries = self.counts(cell)
        return thompson(rng, wins, tries + pending, self.prior_of(cell, seen))

    def value(
        self,
        archive: HarmArchive,
        cell: CellId,
        rng: Random,
        *,
        pending: int = 0,
        seen: Mapping[CellId, tuple[int, int]] | None = None,
    ) -> float:
        """A Thompson draw of what an attempt at ``cell`` adds to ``archive``: for a cell not
        filled, its success rate (:meth:`draw`); for a filled one, :data:`SEED` times that
        plus a draw of its improvement rate (attempts since it was filled that raised its
        severity, a Beta posterior on the options' prior) times one step (:func:`step`)."""
        success = self.draw(cell, rng, pending=pending, seen=seen)
        if not archive.is_filled(cell):
            return success
        gained, tries = self.gains(cell)
        better = thompson(rng, gained, tries + pending, self.prior)
        return success * SEED + better * step(archive, cell)

    def pick(self, archive: HarmArchive, rng: Random, cells: list[CellId] | None = None) -> CellId:
        """The target among ``cells`` (default: the archive's): the highest :meth:`value`;
        uniformly any of them when none can add anything."""
        pool = list(archive) if cells is None else cells
        seen = {c: self.counts(c) for c in archive} if self.borrow else None
        scored = [(v, c) for c in pool if (v := self.value(archive, c, rng, seen=seen)) > 0]
        if not scored:
            return rng.choice(pool)
        return max(scored, key=lambda item: item[0])[1]
