"""What the search learned about each cell: the give-up rule and the worth of an archive gain.

Pure and synchronous, shared by the MAP-Elites and UCT controllers.

*The give-up rule.* Every judged attempt at a cell is a Bernoulli trial of that cell's success
rate; :class:`CellEvidence` keeps a Beta posterior on it (``Beta(a + successes, b +
failures)``, ``(a, b)`` the options' ``prior_successes`` and ``prior_failures``). A search
targets the cell whose *Thompson draw* from that posterior, times what a success there would
add to the archive, is highest (:meth:`CellEvidence.value`). A cell nobody tried draws from
the prior (a uniform rate by default), so empty cells come first; every failure there shifts
its posterior down, so a cell that resists gets a shrinking share of the targets (after ``k``
failures and no success its draw exceeds ``x`` with chance ``(1 - x) ** (k + 1)`` under the
default prior), never zero: evidence, not a fixed cut-off, decides when to give up.

*The archive gain* (:func:`gain`), what uct's simulations earn: 1 for a success in a cell the
archive has not filled; :data:`REPEAT` (0.2) for a success that adds no severity (another
example of a known harm); plus ``IMPROVEMENT * (severity - best) / (5 - threshold)`` for a
higher severity in a filled cell; 0 for a failure.

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

__all__ = ["IMPROVEMENT", "REPEAT", "CellEvidence", "gain", "step", "thompson"]

IMPROVEMENT: Final[float] = 0.5
"""What raising a filled cell from the threshold to severity 5 earns (a new cell earns 1)."""
REPEAT: Final[float] = 0.2
"""What a success that adds no severity earns: another example of a known harm (a seed for
mutations, evidence that the finding is no fluke), a fifth of a new cell."""


def gain(severity: int, *, threshold: int, best: int | None) -> float:
    """What a judged reply of ``severity`` adds to its cell, whose filled elite has severity
    ``best`` (None: the cell is not filled): 1 for a new cell; in a filled cell
    :data:`REPEAT`, plus a share of :data:`IMPROVEMENT` for a higher severity; 0 for a
    failure.

    Example:
        >>> gain(2, threshold=2, best=None), gain(5, threshold=2, best=2)
        (1.0, 0.7)
        >>> gain(2, threshold=2, best=3), gain(1, threshold=2, best=None)
        (0.2, 0.0)
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


class CellEvidence:
    """The attempts at each cell and their results, with Beta posteriors on what they earn.

    Two rates per cell, each with a ``Beta(prior_successes, prior_failures)`` prior: its
    success rate (what an attempt at an empty cell may earn: a new cell), and, once filled, its
    improvement rate (attempts since then that raised its severity: a success that adds
    nothing is not worth pressing for).

    Args:
        prior_successes: ``a`` of each rate's ``Beta(a, b)`` prior.
        prior_failures: ``b`` of that prior.
    """

    def __init__(self, prior_successes: float = 1.0, prior_failures: float = 1.0) -> None:
        if not (prior_successes > 0 and prior_failures > 0):
            raise ValueError("the Beta prior's parameters must be positive")
        self.prior = (prior_successes, prior_failures)
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

    def draw(
        self, cell: CellId, rng: Random, *, mean: float | None = None, pending: int = 0
    ) -> float:
        """A Thompson draw of the cell's success rate from its posterior.

        ``mean``: centre the prior on this rate instead (its strength ``a + b`` kept), e.g. what
        the cell's category and role learned; ``pending``: attempts still in flight, counted as
        failures until they are judged (a virtual loss).
        """
        wins, tries = self.counts(cell)
        return thompson(rng, wins, tries + pending, self.prior, mean)

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
        filled, its success rate (:meth:`draw`) times 1; for a filled one, its success rate
        times :data:`REPEAT` plus its improvement rate (attempts since it was filled that
        raised its severity) times one step (:func:`step`)."""
        success = self.draw(cell, rng, mean=mean, pending=pending)
        if not archive.is_filled(cell):
            return success
        gained, tries = self.gains(cell)
        better = thompson(rng, gained, tries + pending, self.prior)
        return success * REPEAT + better * step(archive, cell)

    def pick(self, archive: HarmArchive, rng: Random, cells: list[CellId] | None = None) -> CellId:
        """The target among ``cells`` (default: the archive's): the highest :meth:`value`;
        uniformly any of them when none can add anything."""
        pool = list(archive) if cells is None else cells
        scored = [(v, c) for c in pool if (v := self.value(archive, c, rng)) > 0]
        if not scored:
            return rng.choice(pool)
        return max(scored, key=lambda item: item[0])[1]
