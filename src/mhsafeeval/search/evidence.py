"""What the search learned about each cell: the give-up rule and the worth of an archive gain.

Pure and synchronous, shared by the MAP-Elites and UCT controllers.

*The give-up rule.* Every judged attempt at a cell is a Bernoulli trial of that cell's success
rate; :class:`CellEvidence` keeps a Beta posterior on it (``Beta(a + successes, b +
failures)``). uct centres that prior on what the cell's neighbours showed (:func:`pooled`: its
category's rate, twice, and its role's), with the strength of the options' ``prior_successes +
prior_failures`` plus a quarter of the category's attempts: a model that gives way in one cell
of a category tends to give way in its neighbours, and a category that keeps resisting makes
its untried cells unpromising too. map-elites keeps the even prior (``CellEvidence(pool=False)``,
the default: pooling cost it true cells where a category mixes easy and never-harmable cells).
A search targets the cell whose *Thompson draw* from that posterior, times what a success there
would add to the archive (:func:`worth`), is highest (:meth:`CellEvidence.value`). A cell
nobody tried draws from an even prior, so empty cells come first; every failure shifts its
posterior down, so a cell that resists gets a shrinking share of the targets, never zero:
evidence, not a fixed cut-off, decides when to give up.

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
also commits a turn at its first success) finds as many true cells as map-elites in 400 calls
of the layered world (the tables are in docs/campaigns.md).

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

from random import Random
from typing import Final

from .archive import CellId, HarmArchive

__all__ = [
    "IMPROVEMENT",
    "REPEAT",
    "SEED",
    "CellEvidence",
    "gain",
    "pooled",
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
    mean: float | None = None,
) -> float:
    """A draw from ``Beta(a + wins, b + tries - wins)``, ``(a, b) = prior``; with ``mean``, the
    prior is centred on that rate instead, its strength ``a + b`` kept."""
    a, b = prior
    if mean is not None:
        m = min(1 - 1e-6, max(1e-6, mean))
        a, b = m * (a + b), (1 - m) * (a + b)
    return rng.betavariate(a + wins, b + max(0.0, tries - wins))


def pooled(
    category: tuple[float, float], role: tuple[float, float], prior: tuple[float, float]
) -> tuple[float, float]:
    """The centre and strength of a cell's prior from its neighbours' ``(successes,
    attempts)``: the category's and the role's rates, each smoothed towards an even chance
    with the weight of one attempt, the category weighing twice the role (a model that gives
    way in one cell of a category tends to give way in its neighbours); the strength is the
    prior's ``a + b`` plus a quarter of the category's attempts, so a category that keeps
    resisting makes its untried cells look unpromising before each was tried on its own.

    Example:
        >>> pooled((0, 0), (0, 0), (1.0, 1.0))
        (0.5, 2.0)
        >>> centre, strength = pooled((0, 12), (1, 6), (1.0, 1.0))
        >>> round(centre, 3), strength
        (0.097, 5.0)
    """

    def smooth(wins: float, tries: float) -> float:
        return (wins + 0.5) / (tries + 1)

    centre = (2 * smooth(*category) + smooth(*role)) / 3
    return centre, sum(prior) + category[1] / 4


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
        pool: centre each cell's success-rate prior on its category's and role's rates
            (:meth:`centre`) instead of ``a / (a + b)``. Off for map-elites: measured over 20
            seeds, pooling raised its successes per call in the fixed world (0.080 to 0.120,
            above random's 0.107) but cost it 2.5 of 20.5 true cells in the layered world,
            whose categories mix easy and never-harmable cells; the tool reports cells.
    """

    def __init__(
        self, prior_successes: float = 1.0, prior_failures: float = 1.0, *, pool: bool = False
    ) -> None:
        if not (prior_successes > 0 and prior_failures > 0):
            raise ValueError("the Beta prior's parameters must be positive")
        self.prior = (prior_successes, prior_failures)
        self.pool = pool
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

    def level(self, category: str | None = None, role: str | None = None) -> tuple[int, int]:
        """``(successes, attempts)`` over the cells of one ``category`` or one ``role``."""
        wins = tries = 0
        for (c, r), slot in self._counts.items():
            if (category is None or c == category) and (role is None or r == role):
                wins, tries = wins + slot[0], tries + slot[1]
        return wins, tries

    def centre(self, cell: CellId) -> tuple[float, float]:
        """The centre of the cell's prior, pooled from its category and role (:func:`pooled`),
        and its strength ``prior_successes + prior_failures``."""
        category, role = cell
        centre, _ = pooled(self.level(category=category), self.level(role=role), self.prior)
        # The prior keeps the options' strength: the cell's own failures soon outweigh its
        # neighbours' successes, so a cell that never gives way in a category that does is
        # given up too.
        return centre, sum(self.prior)

    def draw(
        self, cell: CellId, rng: Random, *, mean: float | None = None, pending: int = 0
    ) -> float:
        """A Thompson draw of the cell's success rate from its posterior.

        With ``pool``, the prior is centred on what the cell's category and role learned
        (:meth:`centre`); ``mean``: centre it on this rate instead, with the options' strength
        ``a + b``;
        ``pending``: attempts still in flight, counted as failures until they are judged (a
        virtual loss).
        """
        wins, tries = self.counts(cell)
        if mean is not None or not self.pool:
            return thompson(rng, wins, tries + pending, self.prior, mean)
        centre, strength = self.centre(cell)
        return thompson(rng, wins, tries + pending, (strength / 2, strength / 2), centre)

    def value(
        self,
        archive: HarmArchive,
        cell: CellId,
        rng: Random,
        *,
        mean: float | None = None,
        pending: int = 0,
    ) -> float:
        """A Thompson draw of what an attempt at ``cell`` adds to ``archive``: for a cell not
        filled, its success rate (:meth:`draw`); for a filled one, :data:`SEED` times that
        plus a draw of its improvement rate (attempts since it was filled that raised its
        severity, a Beta posterior on the options' prior) times one step (:func:`step`)."""
        success = self.draw(cell, rng, mean=mean, pending=pending)
        if not archive.is_filled(cell):
            return success
        gained, tries = self.gains(cell)
        better = thompson(rng, gained, tries + pending, self.prior)
        return success * SEED + better * step(archive, cell)

    def pick(self, archive: HarmArchive, rng: Random, cells: list[CellId] | None = None) -> CellId:
        """The target among ``cells`` (default: the archive's): the highest :meth:`value`;
        uniformly any of them when none can add anything."""
        pool = list(archive) if cells is None else cells
        scored = [(v, c) for c in pool if (v := self.value(archive, c, rng)) > 0]
        if not scored:
            return rng.choice(pool)
        return max(scored, key=lambda item: item[0])[1]
